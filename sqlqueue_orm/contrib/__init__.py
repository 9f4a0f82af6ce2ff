"""sqlqueue_orm.contrib."""
