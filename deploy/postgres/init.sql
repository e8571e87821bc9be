-- Run once by the postgres image on an empty volume: Dagster uses $POSTGRES_DB, MLflow its own database.
CREATE DATABASE mlflow;
