"""Verb: ``models``: pretrained base models reachable offline, by pinned recipe.

    training-assets models list                            # the recipes and whether each is fetched
    training-assets models fetch smollm2-135m-instruct     # download, verify, convert once; prints the folder

The folder goes to ``$TRAINING_ASSETS_MODELS`` (a cache several data roots share) or
``<root>/models``. Select it for the graph with the ``base_model`` asset's ``model`` config.
"""

from __future__ import annotations

import argparse
import sys

from training_assets.base_model import fetch
from training_assets.commands import emit, fail


def _list(args: argparse.Namespace) -> int:
    rows = []
    for name, recipe in sorted(fetch.RECIPES.items()):
        folder = fetch.models_dir(args.root) / name
        rows.append({"name": name, "license": recipe.license, "summary": recipe.summary,
                     "fetched": (folder / fetch.MANIFEST).is_file(), "folder": str(folder)})
    emit(args, rows, "\n".join(f"{r['name']:<24} {'fetched' if r['fetched'] else 'not fetched':<12} {r['summary']}"
                               for r in rows))
    return 0


def _fetch(args: argparse.Namespace) -> int:
    try:
        folder = fetch.ensure_model(args.name, args.root, log=lambda line: print(line, file=sys.stderr))
        digest = fetch.model_hash(folder)
    except fetch.FetchError as exc:
        return fail(str(exc))
    emit(args, {"name": args.name, "folder": str(folder), "model_hash": digest}, str(folder))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("models", help="pretrained base models fetched offline by pinned recipe")
    verbs = p.add_subparsers(dest="models_verb", required=True)
    for name, handler, text in (("list", _list, "the recipes and whether each is fetched"),
                                ("fetch", _fetch, "download, verify and convert a recipe once (idempotent)")):
        v = verbs.add_parser(name, help=text)
        if name == "fetch":
            v.add_argument("name", choices=sorted(fetch.RECIPES), help="the recipe")
        v.add_argument("--root", default=None, help="data root (default: $TRAINING_ASSETS_DATA or ./data); "
                                                    f"${fetch.MODELS_ENV} overrides where models go")
        v.add_argument("--json", action="store_true", help="machine-readable output")
        v.set_defaults(handler=handler)
