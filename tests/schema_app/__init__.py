"""
A test-only app whose migrations each test writes into a temporary package
(``tests/support/schema_settings.py`` points ``MIGRATION_MODULES`` at it), so a
real ``manage.py migrate`` can apply every schema operation to a synced model.
"""
