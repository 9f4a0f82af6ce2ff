BEGIN TRANSACTION;

-- Running upgrade 0008_postgresql_nsb_layout -> 0009_delayed_delivery

-- every delayed table in [o'brien]]]: create its index on Due
DECLARE @table nvarchar(517), @sql nvarchar(max);
DECLARE delayed_tables CURSOR LOCAL STATIC READ_ONLY FOR
    SELECT QUOTENAME(s.name) + N'.' + QUOTENAME(t.name)
    FROM sys.tables AS t JOIN sys.schemas AS s ON s.schema_id = t.schema_id
    WHERE t.is_ms_shipped = 0 AND (s.name IN (N'o''brien]'))
        AND (SELECT COUNT(*) FROM sys.columns AS c WHERE c.object_id = t.object_id AND c.name IN (N'Headers', N'Body', N'Due', N'RowVersion')) = 4
        AND NOT EXISTS (SELECT 1 FROM sys.columns AS c WHERE c.object_id = t.object_id AND c.name = N'Expires')
        AND NOT EXISTS (SELECT 1 FROM sys.index_columns AS ic JOIN sys.columns AS c ON c.object_id = ic.object_id AND c.column_id = ic.column_id WHERE ic.object_id = t.object_id AND ic.key_ordinal = 1 AND c.name = N'Due')
    ORDER BY s.name, t.name;
OPEN delayed_tables;
FETCH NEXT FROM delayed_tables INTO @table;
WHILE @@FETCH_STATUS = 0
BEGIN
    PRINT N'delayed table ' + @table + N': 0009_delayed_delivery upgrade';
    SET @sql = N'CREATE NONCLUSTERED INDEX [Index_Due] ON ' + @table + N' ([Due])';
    EXEC sp_executesql @sql;
    FETCH NEXT FROM delayed_tables INTO @table;
END
CLOSE delayed_tables;
DEALLOCATE delayed_tables;

GO

UPDATE sqlqueue_alembic_version SET version_num='0009_delayed_delivery' WHERE sqlqueue_alembic_version.version_num = '0008_postgresql_nsb_layout';

GO

COMMIT;

GO

