from sqlqueue_orm.migration.environment import run_migrations

run_migrations()
