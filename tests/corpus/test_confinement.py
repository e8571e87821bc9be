"""What run config may reach: files under the data root (or an allowed source folder), Ray clusters
on allowed hosts; refused, naming the field and the fix, where the library opens them."""

import json
import os

import pytest

from training_assets import data_engine, paths
from training_assets.data_engine import corpus, local_engine, ray_engine


def _held_out(folder, name="evals.jsonl"):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps({"id": "e1", "prompt": "what is the capital of france"}) + "\n")
    return path


def test_a_file_outside_the_data_root_is_refused_naming_the_field_and_the_fix(data_root, tmp_path):
    outside = _held_out(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match=r"held_out_sets paths\[0\]: .*outside the data root.*TRAINING_ASSETS_SOURCE_DIRS"):
        data_engine.write_held_out_sets([outside], data_root)
    assert not (data_root / corpus.HELD_OUT_ASSET).exists(), "nothing was written"
    with pytest.raises(ValueError, match=r"extra_sources\[0\]: /etc/passwd is outside the data root"):
        local_engine.gather_records(data_root, ["/etc/passwd"])
    with pytest.raises(ValueError, match=r"extra_sources\[0\]"):
        ray_engine.plan_shards(data_root, ("/etc/passwd",), 100)


def test_symlinks_and_dot_dots_are_resolved_before_the_check(data_root, tmp_path):
    target = _held_out(tmp_path / "elsewhere")
    link = data_root / "held_out" / "evals.jsonl"
    link.parent.mkdir()
    link.symlink_to(target)
    with pytest.raises(ValueError, match=rf"{link} \(-> {target}\) is outside the data root"):
        data_engine.write_held_out_sets([link], data_root)
    with pytest.raises(ValueError, match="outside the data root"):
        paths.confine_path(data_root / ".." / "elsewhere" / "evals.jsonl", "f", data_root)


def test_a_folder_of_the_allow_list_is_readable(data_root, tmp_path, monkeypatch):
    inside = _held_out(data_root / "held_out")
    assert data_engine.write_held_out_sets([inside], data_root)["examples"] == 1
    shared = _held_out(tmp_path / "shared", "shared.jsonl")
    monkeypatch.setenv(paths.SOURCE_DIRS_ENV, os.pathsep.join([str(tmp_path / "nowhere"), str(tmp_path / "shared")]))
    assert data_engine.write_held_out_sets([shared], data_root)["per_set"] == {"shared": 1}
    assert paths.confine_path(shared, "f", data_root) == shared.resolve()


class _Ray:
    """Stands in for the ray module: records whether anything tried to connect."""

    def __init__(self):
        self.inits = []

    def is_initialized(self):
        return False

    def init(self, address, **kwargs):
        self.inits.append(address)
        return None


@pytest.mark.parametrize("address,allowed", [
    ("127.0.0.1:6379", True), ("ray://localhost:10001", True), ("[::1]:6379", True), ("auto", True),
    ("head.internal:6379", False), ("ray://203.0.113.7:10001", False),
])
def test_a_ray_cluster_must_be_on_an_allowed_host(monkeypatch, address, allowed):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv(paths.RAY_HOSTS_ENV, raising=False)
    ray = _Ray()
    if allowed:
        ray_engine.connect(ray, address)
        assert ray.inits == [address]
        return
    with pytest.raises(ValueError, match=r"ray_address: .*TRAINING_ASSETS_RAY_HOSTS"):
        ray_engine.connect(ray, address)
    assert ray.inits == [], "refused before connecting"
    monkeypatch.setenv(paths.RAY_HOSTS_ENV, f"other, {paths.ray_host(address)}")
    ray_engine.connect(ray, address)
    assert ray.inits == [address]


def test_the_ray_address_host_is_allowed_by_default(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "ray://head.internal:10001")
    monkeypatch.delenv(paths.RAY_HOSTS_ENV, raising=False)
    assert paths.confine_ray_address("head.internal:6379", "ray_address") == "head.internal:6379"
