from sqlqueue_orm.migration.runner import run_migrations

run_migrations()
