"""``python -m sqlqueue_orm.cli``: the ``sqlqueue`` command."""

from sqlqueue_orm.cli import main

raise SystemExit(main())
