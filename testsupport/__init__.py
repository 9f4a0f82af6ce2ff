"""What the tests, the benchmarks and the scripts share, none of them importing another.

A throwaway PostgreSQL cluster (:mod:`testsupport.pg_cluster`), its throwaway databases
(:mod:`testsupport.databases`), a headless browser (:mod:`testsupport.browser`), a user's own
outbox application (:mod:`testsupport.outbox_app`) and the queue tables of earlier releases
(:mod:`testsupport.legacy`). Not part of the library: the wheel leaves it out.
"""
