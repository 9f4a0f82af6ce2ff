"""sqlqueue_orm.sending."""
