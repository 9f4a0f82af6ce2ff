"""sqlqueue_orm.receiving."""
