"""sqlqueue_orm.contrib.spark."""
