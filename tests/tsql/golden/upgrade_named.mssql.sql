BEGIN TRANSACTION;

CREATE TABLE sqlqueue_alembic_version (
    version_num VARCHAR(32) NOT NULL, 
    CONSTRAINT sqlqueue_alembic_version_pkc PRIMARY KEY (version_num)
);

GO

-- Running upgrade  -> 0001_expires_index

COMMIT;

GO

-- queue orders-v1 queue.x@[Legacy Queues]: 0001_expires_index upgrade: Index_Expires (Expires) INCLUDE (Id, RowVersion)
SET NOCOUNT ON; SET XACT_ABORT ON; SET NUMERIC_ROUNDABORT OFF;
SET ANSI_PADDING, ANSI_WARNINGS, CONCAT_NULL_YIELDS_NULL, ARITHABORT, QUOTED_IDENTIFIER, ANSI_NULLS ON;
DECLARE @object_id int = OBJECT_ID(N'[Legacy Queues].[orders-v1 queue.x]', N'U');
DECLARE @online bit = CASE WHEN CAST(SERVERPROPERTY('EngineEdition') AS int) IN (3, 5, 8) THEN 1 ELSE 0 END;
DECLARE @index sysname, @sql nvarchar(max), @message nvarchar(2048), @flag bit;
IF @object_id IS NULL OR (SELECT COUNT(*) FROM sys.columns WHERE object_id = @object_id AND name IN (N'Id', N'Expires', N'Headers', N'Body', N'RowVersion')) < 5
BEGIN
    PRINT N'queue ' + N'[Legacy Queues].[orders-v1 queue.x]' + N': no queue table there; skipped';
END
ELSE
BEGIN
    BEGIN TRANSACTION;
    -- adopt an index on (Expires) that has another name
    IF NOT EXISTS (SELECT 1 FROM sys.indexes AS i WHERE i.object_id = @object_id AND i.name = N'Index_Expires')
    BEGIN
        SET @index = NULL;
        SELECT TOP (1) @index = i.name FROM sys.indexes AS i
        WHERE i.object_id = @object_id AND i.type IN (2) AND i.is_unique = 0 AND i.is_hypothetical = 0
            AND EXISTS (SELECT 1 FROM sys.index_columns AS ic JOIN sys.columns AS c ON c.object_id = ic.object_id AND c.column_id = ic.column_id WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.key_ordinal = 1 AND c.name = N'Expires') AND NOT EXISTS (SELECT 1 FROM sys.index_columns AS ic WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.key_ordinal > 1)
        ORDER BY i.type, i.index_id;
        IF @index IS NOT NULL
        BEGIN
            SET @sql = N'[Legacy Queues].[orders-v1 queue.x]' + N'.' + QUOTENAME(@index);
            EXEC sp_rename @objname = @sql, @newname = N'Index_Expires', @objtype = N'INDEX';
            PRINT N'queue ' + N'[Legacy Queues].[orders-v1 queue.x]' + N': renamed index ' + QUOTENAME(@index) + N' to ' + N'[Index_Expires]';
        END
    END
    -- Index_Expires must be (Expires) INCLUDE (Id, RowVersion), nonclustered
    IF EXISTS (SELECT 1 FROM sys.indexes AS i WHERE i.object_id = @object_id AND i.name = N'Index_Expires' AND i.type = 2 AND NOT (EXISTS (SELECT 1 FROM sys.index_columns AS ic JOIN sys.columns AS c ON c.object_id = ic.object_id AND c.column_id = ic.column_id WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.key_ordinal = 1 AND c.name = N'Expires') AND NOT EXISTS (SELECT 1 FROM sys.index_columns AS ic WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.key_ordinal > 1) AND (SELECT COUNT(*) FROM sys.index_columns AS ic JOIN sys.columns AS c ON c.object_id = ic.object_id AND c.column_id = ic.column_id WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.is_included_column = 1 AND c.name IN (N'Id', N'RowVersion')) = 2))
    BEGIN
        IF @online = 1
        BEGIN
            CREATE NONCLUSTERED INDEX [Index_Expires] ON [Legacy Queues].[orders-v1 queue.x] ([Expires]) INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL WITH (DROP_EXISTING = ON, ONLINE = ON);
        END
        ELSE
        BEGIN
            CREATE NONCLUSTERED INDEX [Index_Expires] ON [Legacy Queues].[orders-v1 queue.x] ([Expires]) INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL WITH (DROP_EXISTING = ON);
        END
    END
    ELSE
    BEGIN
        IF EXISTS (SELECT 1 FROM sys.indexes AS i WHERE i.object_id = @object_id AND i.name = N'Index_Expires' AND i.type <> 2)
        BEGIN
            DROP INDEX [Index_Expires] ON [Legacy Queues].[orders-v1 queue.x];
            IF @online = 1
            BEGIN
                CREATE NONCLUSTERED INDEX [Index_Expires] ON [Legacy Queues].[orders-v1 queue.x] ([Expires]) INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL WITH (ONLINE = ON);
            END
            ELSE
            BEGIN
                CREATE NONCLUSTERED INDEX [Index_Expires] ON [Legacy Queues].[orders-v1 queue.x] ([Expires]) INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL;
            END
        END
        ELSE
        BEGIN
            IF NOT EXISTS (SELECT 1 FROM sys.indexes AS i WHERE i.object_id = @object_id AND i.name = N'Index_Expires')
            BEGIN
                IF @online = 1
                BEGIN
                    CREATE NONCLUSTERED INDEX [Index_Expires] ON [Legacy Queues].[orders-v1 queue.x] ([Expires]) INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL WITH (ONLINE = ON);
                END
                ELSE
                BEGIN
                    CREATE NONCLUSTERED INDEX [Index_Expires] ON [Legacy Queues].[orders-v1 queue.x] ([Expires]) INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL;
                END
            END
        END
    END
    COMMIT TRANSACTION;
END;

GO

-- queue o'brien] q@[sa]]les]: 0001_expires_index upgrade: Index_Expires (Expires) INCLUDE (Id, RowVersion)
SET NOCOUNT ON; SET XACT_ABORT ON; SET NUMERIC_ROUNDABORT OFF;
SET ANSI_PADDING, ANSI_WARNINGS, CONCAT_NULL_YIELDS_NULL, ARITHABORT, QUOTED_IDENTIFIER, ANSI_NULLS ON;
DECLARE @object_id int = OBJECT_ID(N'[sa]]les].[o''brien]] q]', N'U');
DECLARE @online bit = CASE WHEN CAST(SERVERPROPERTY('EngineEdition') AS int) IN (3, 5, 8) THEN 1 ELSE 0 END;
DECLARE @index sysname, @sql nvarchar(max), @message nvarchar(2048), @flag bit;
IF @object_id IS NULL OR (SELECT COUNT(*) FROM sys.columns WHERE object_id = @object_id AND name IN (N'Id', N'Expires', N'Headers', N'Body', N'RowVersion')) < 5
BEGIN
    PRINT N'queue ' + N'[sa]]les].[o''brien]] q]' + N': no queue table there; skipped';
END
ELSE
BEGIN
    BEGIN TRANSACTION;
    -- adopt an index on (Expires) that has another name
    IF NOT EXISTS (SELECT 1 FROM sys.indexes AS i WHERE i.object_id = @object_id AND i.name = N'Index_Expires')
    BEGIN
        SET @index = NULL;
        SELECT TOP (1) @index = i.name FROM sys.indexes AS i
        WHERE i.object_id = @object_id AND i.type IN (2) AND i.is_unique = 0 AND i.is_hypothetical = 0
            AND EXISTS (SELECT 1 FROM sys.index_columns AS ic JOIN sys.columns AS c ON c.object_id = ic.object_id AND c.column_id = ic.column_id WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.key_ordinal = 1 AND c.name = N'Expires') AND NOT EXISTS (SELECT 1 FROM sys.index_columns AS ic WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.key_ordinal > 1)
        ORDER BY i.type, i.index_id;
        IF @index IS NOT NULL
        BEGIN
            SET @sql = N'[sa]]les].[o''brien]] q]' + N'.' + QUOTENAME(@index);
            EXEC sp_rename @objname = @sql, @newname = N'Index_Expires', @objtype = N'INDEX';
            PRINT N'queue ' + N'[sa]]les].[o''brien]] q]' + N': renamed index ' + QUOTENAME(@index) + N' to ' + N'[Index_Expires]';
        END
    END
    -- Index_Expires must be (Expires) INCLUDE (Id, RowVersion), nonclustered
    IF EXISTS (SELECT 1 FROM sys.indexes AS i WHERE i.object_id = @object_id AND i.name = N'Index_Expires' AND i.type = 2 AND NOT (EXISTS (SELECT 1 FROM sys.index_columns AS ic JOIN sys.columns AS c ON c.object_id = ic.object_id AND c.column_id = ic.column_id WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.key_ordinal = 1 AND c.name = N'Expires') AND NOT EXISTS (SELECT 1 FROM sys.index_columns AS ic WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.key_ordinal > 1) AND (SELECT COUNT(*) FROM sys.index_columns AS ic JOIN sys.columns AS c ON c.object_id = ic.object_id AND c.column_id = ic.column_id WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.is_included_column = 1 AND c.name IN (N'Id', N'RowVersion')) = 2))
    BEGIN
        IF @online = 1
        BEGIN
            CREATE NONCLUSTERED INDEX [Index_Expires] ON [sa]]les].[o'brien]] q] ([Expires]) INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL WITH (DROP_EXISTING = ON, ONLINE = ON);
        END
        ELSE
        BEGIN
            CREATE NONCLUSTERED INDEX [Index_Expires] ON [sa]]les].[o'brien]] q] ([Expires]) INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL WITH (DROP_EXISTING = ON);
        END
    END
    ELSE
    BEGIN
        IF EXISTS (SELECT 1 FROM sys.indexes AS i WHERE i.object_id = @object_id AND i.name = N'Index_Expires' AND i.type <> 2)
        BEGIN
            DROP INDEX [Index_Expires] ON [sa]]les].[o'brien]] q];
            IF @online = 1
            BEGIN
                CREATE NONCLUSTERED INDEX [Index_Expires] ON [sa]]les].[o'brien]] q] ([Expires]) INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL WITH (ONLINE = ON);
            END
            ELSE
            BEGIN
                CREATE NONCLUSTERED INDEX [Index_Expires] ON [sa]]les].[o'brien]] q] ([Expires]) INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL;
            END
        END
        ELSE
        BEGIN
            IF NOT EXISTS (SELECT 1 FROM sys.indexes AS i WHERE i.object_id = @object_id AND i.name = N'Index_Expires')
            BEGIN
                IF @online = 1
                BEGIN
                    CREATE NONCLUSTERED INDEX [Index_Expires] ON [sa]]les].[o'brien]] q] ([Expires]) INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL WITH (ONLINE = ON);
                END
                ELSE
                BEGIN
                    CREATE NONCLUSTERED INDEX [Index_Expires] ON [sa]]les].[o'brien]] q] ([Expires]) INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL;
                END
            END
        END
    END
    COMMIT TRANSACTION;
END;

GO

BEGIN TRANSACTION;

INSERT INTO sqlqueue_alembic_version (version_num) OUTPUT inserted.version_num VALUES ('0001_expires_index');

GO

COMMIT;

GO

BEGIN TRANSACTION;

-- Running upgrade 0001_expires_index -> 0002_headers_nvarchar

COMMIT;

GO

-- queue orders-v1 queue.x@[Legacy Queues]: 0002_headers_nvarchar upgrade: Headers to nvarchar(max) / text NOT NULL
SET NOCOUNT ON; SET XACT_ABORT ON; SET NUMERIC_ROUNDABORT OFF;
SET ANSI_PADDING, ANSI_WARNINGS, CONCAT_NULL_YIELDS_NULL, ARITHABORT, QUOTED_IDENTIFIER, ANSI_NULLS ON;
DECLARE @object_id int = OBJECT_ID(N'[Legacy Queues].[orders-v1 queue.x]', N'U');
DECLARE @online bit = CASE WHEN CAST(SERVERPROPERTY('EngineEdition') AS int) IN (3, 5, 8) THEN 1 ELSE 0 END;
DECLARE @index sysname, @sql nvarchar(max), @message nvarchar(2048), @flag bit;
IF @object_id IS NULL OR (SELECT COUNT(*) FROM sys.columns WHERE object_id = @object_id AND name IN (N'Id', N'Expires', N'Headers', N'Body', N'RowVersion')) < 5
BEGIN
    PRINT N'queue ' + N'[Legacy Queues].[orders-v1 queue.x]' + N': no queue table there; skipped';
END
ELSE
BEGIN
    BEGIN TRANSACTION;
    -- varchar -> nvarchar(max) keeps every character (each maps to Unicode); size-of-data
    IF EXISTS (SELECT 1 FROM sys.columns AS c WHERE c.object_id = @object_id AND c.name = N'Headers' AND (TYPE_NAME(c.system_type_id) <> N'nvarchar' OR c.max_length <> -1 OR c.is_nullable = 1))
    BEGIN
        IF EXISTS (SELECT 1 FROM sys.columns AS c WHERE c.object_id = @object_id AND c.name = N'Headers' AND (TYPE_NAME(c.system_type_id) NOT IN (N'varchar', N'nvarchar', N'text', N'ntext')))
        BEGIN
            SET @message = N'queue ' + N'[Legacy Queues].[orders-v1 queue.x]' + N': column [Headers] is neither varchar nor nvarchar; convert it by hand';
            THROW 50000, @message, 1;
        END
        ALTER TABLE [Legacy Queues].[orders-v1 queue.x] ALTER COLUMN [Headers] NVARCHAR(max) NOT NULL;
    END
    COMMIT TRANSACTION;
END;

GO

-- queue o'brien] q@[sa]]les]: 0002_headers_nvarchar upgrade: Headers to nvarchar(max) / text NOT NULL
SET NOCOUNT ON; SET XACT_ABORT ON; SET NUMERIC_ROUNDABORT OFF;
SET ANSI_PADDING, ANSI_WARNINGS, CONCAT_NULL_YIELDS_NULL, ARITHABORT, QUOTED_IDENTIFIER, ANSI_NULLS ON;
DECLARE @object_id int = OBJECT_ID(N'[sa]]les].[o''brien]] q]', N'U');
DECLARE @online bit = CASE WHEN CAST(SERVERPROPERTY('EngineEdition') AS int) IN (3, 5, 8) THEN 1 ELSE 0 END;
DECLARE @index sysname, @sql nvarchar(max), @message nvarchar(2048), @flag bit;
IF @object_id IS NULL OR (SELECT COUNT(*) FROM sys.columns WHERE object_id = @object_id AND name IN (N'Id', N'Expires', N'Headers', N'Body', N'RowVersion')) < 5
BEGIN
    PRINT N'queue ' + N'[sa]]les].[o''brien]] q]' + N': no queue table there; skipped';
END
ELSE
BEGIN
    BEGIN TRANSACTION;
    -- varchar -> nvarchar(max) keeps every character (each maps to Unicode); size-of-data
    IF EXISTS (SELECT 1 FROM sys.columns AS c WHERE c.object_id = @object_id AND c.name = N'Headers' AND (TYPE_NAME(c.system_type_id) <> N'nvarchar' OR c.max_length <> -1 OR c.is_nullable = 1))
    BEGIN
        IF EXISTS (SELECT 1 FROM sys.columns AS c WHERE c.object_id = @object_id AND c.name = N'Headers' AND (TYPE_NAME(c.system_type_id) NOT IN (N'varchar', N'nvarchar', N'text', N'ntext')))
        BEGIN
            SET @message = N'queue ' + N'[sa]]les].[o''brien]] q]' + N': column [Headers] is neither varchar nor nvarchar; convert it by hand';
            THROW 50000, @message, 1;
        END
        ALTER TABLE [sa]]les].[o'brien]] q] ALTER COLUMN [Headers] NVARCHAR(max) NOT NULL;
    END
    COMMIT TRANSACTION;
END;

GO

BEGIN TRANSACTION;

UPDATE sqlqueue_alembic_version SET version_num='0002_headers_nvarchar' WHERE sqlqueue_alembic_version.version_num = '0001_expires_index';

GO

COMMIT;

GO

BEGIN TRANSACTION;

-- Running upgrade 0002_headers_nvarchar -> 0003_filter_expires_index

COMMIT;

GO

-- queue orders-v1 queue.x@[Legacy Queues]: 0003_filter_expires_index upgrade: Index_Expires filtered WHERE Expires IS NOT NULL
SET NOCOUNT ON; SET XACT_ABORT ON; SET NUMERIC_ROUNDABORT OFF;
SET ANSI_PADDING, ANSI_WARNINGS, CONCAT_NULL_YIELDS_NULL, ARITHABORT, QUOTED_IDENTIFIER, ANSI_NULLS ON;
DECLARE @object_id int = OBJECT_ID(N'[Legacy Queues].[orders-v1 queue.x]', N'U');
DECLARE @online bit = CASE WHEN CAST(SERVERPROPERTY('EngineEdition') AS int) IN (3, 5, 8) THEN 1 ELSE 0 END;
DECLARE @index sysname, @sql nvarchar(max), @message nvarchar(2048), @flag bit;
IF @object_id IS NULL OR (SELECT COUNT(*) FROM sys.columns WHERE object_id = @object_id AND name IN (N'Id', N'Expires', N'Headers', N'Body', N'RowVersion')) < 5
BEGIN
    PRINT N'queue ' + N'[Legacy Queues].[orders-v1 queue.x]' + N': no queue table there; skipped';
END
ELSE
BEGIN
    BEGIN TRANSACTION;
    IF EXISTS (SELECT 1 FROM sys.indexes AS i WHERE i.object_id = @object_id AND i.name = N'Index_Expires' AND (i.has_filter = 0 OR i.filter_definition <> N'([Expires] IS NOT NULL)'))
    BEGIN
        IF @online = 1
        BEGIN
            CREATE NONCLUSTERED INDEX [Index_Expires] ON [Legacy Queues].[orders-v1 queue.x] ([Expires]) INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL WITH (DROP_EXISTING = ON, ONLINE = ON);
        END
        ELSE
        BEGIN
            CREATE NONCLUSTERED INDEX [Index_Expires] ON [Legacy Queues].[orders-v1 queue.x] ([Expires]) INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL WITH (DROP_EXISTING = ON);
        END
    END
    COMMIT TRANSACTION;
END;

GO

-- queue o'brien] q@[sa]]les]: 0003_filter_expires_index upgrade: Index_Expires filtered WHERE Expires IS NOT NULL
SET NOCOUNT ON; SET XACT_ABORT ON; SET NUMERIC_ROUNDABORT OFF;
SET ANSI_PADDING, ANSI_WARNINGS, CONCAT_NULL_YIELDS_NULL, ARITHABORT, QUOTED_IDENTIFIER, ANSI_NULLS ON;
DECLARE @object_id int = OBJECT_ID(N'[sa]]les].[o''brien]] q]', N'U');
DECLARE @online bit = CASE WHEN CAST(SERVERPROPERTY('EngineEdition') AS int) IN (3, 5, 8) THEN 1 ELSE 0 END;
DECLARE @index sysname, @sql nvarchar(max), @message nvarchar(2048), @flag bit;
IF @object_id IS NULL OR (SELECT COUNT(*) FROM sys.columns WHERE object_id = @object_id AND name IN (N'Id', N'Expires', N'Headers', N'Body', N'RowVersion')) < 5
BEGIN
    PRINT N'queue ' + N'[sa]]les].[o''brien]] q]' + N': no queue table there; skipped';
END
ELSE
BEGIN
    BEGIN TRANSACTION;
    IF EXISTS (SELECT 1 FROM sys.indexes AS i WHERE i.object_id = @object_id AND i.name = N'Index_Expires' AND (i.has_filter = 0 OR i.filter_definition <> N'([Expires] IS NOT NULL)'))
    BEGIN
        IF @online = 1
        BEGIN
            CREATE NONCLUSTERED INDEX [Index_Expires] ON [sa]]les].[o'brien]] q] ([Expires]) INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL WITH (DROP_EXISTING = ON, ONLINE = ON);
        END
        ELSE
        BEGIN
            CREATE NONCLUSTERED INDEX [Index_Expires] ON [sa]]les].[o'brien]] q] ([Expires]) INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL WITH (DROP_EXISTING = ON);
        END
    END
    COMMIT TRANSACTION;
END;

GO

BEGIN TRANSACTION;

UPDATE sqlqueue_alembic_version SET version_num='0003_filter_expires_index' WHERE sqlqueue_alembic_version.version_num = '0002_headers_nvarchar';

GO

COMMIT;

GO

BEGIN TRANSACTION;

-- Running upgrade 0003_filter_expires_index -> 0004_rowversion_layout

COMMIT;

GO

-- queue orders-v1 queue.x@[Legacy Queues]: 0004_rowversion_layout upgrade: RowVersion and Index_RowVersion to the current layout
SET NOCOUNT ON; SET XACT_ABORT ON; SET NUMERIC_ROUNDABORT OFF;
SET ANSI_PADDING, ANSI_WARNINGS, CONCAT_NULL_YIELDS_NULL, ARITHABORT, QUOTED_IDENTIFIER, ANSI_NULLS ON;
DECLARE @object_id int = OBJECT_ID(N'[Legacy Queues].[orders-v1 queue.x]', N'U');
DECLARE @online bit = CASE WHEN CAST(SERVERPROPERTY('EngineEdition') AS int) IN (3, 5, 8) THEN 1 ELSE 0 END;
DECLARE @index sysname, @sql nvarchar(max), @message nvarchar(2048), @flag bit;
IF @object_id IS NULL OR (SELECT COUNT(*) FROM sys.columns WHERE object_id = @object_id AND name IN (N'Id', N'Expires', N'Headers', N'Body', N'RowVersion')) < 5
BEGIN
    PRINT N'queue ' + N'[Legacy Queues].[orders-v1 queue.x]' + N': no queue table there; skipped';
END
ELSE
BEGIN
    BEGIN TRANSACTION;
    -- adopt an index on (RowVersion) that has another name
    IF NOT EXISTS (SELECT 1 FROM sys.indexes AS i WHERE i.object_id = @object_id AND i.name = N'Index_RowVersion')
    BEGIN
        SET @index = NULL;
        SELECT TOP (1) @index = i.name FROM sys.indexes AS i
        WHERE i.object_id = @object_id AND i.type IN (1, 2) AND i.is_unique = 0 AND i.is_hypothetical = 0
            AND EXISTS (SELECT 1 FROM sys.index_columns AS ic JOIN sys.columns AS c ON c.object_id = ic.object_id AND c.column_id = ic.column_id WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.key_ordinal = 1 AND c.name = N'RowVersion') AND NOT EXISTS (SELECT 1 FROM sys.index_columns AS ic WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.key_ordinal > 1)
        ORDER BY i.type, i.index_id;
        IF @index IS NOT NULL
        BEGIN
            SET @sql = N'[Legacy Queues].[orders-v1 queue.x]' + N'.' + QUOTENAME(@index);
            EXEC sp_rename @objname = @sql, @newname = N'Index_RowVersion', @objtype = N'INDEX';
            PRINT N'queue ' + N'[Legacy Queues].[orders-v1 queue.x]' + N': renamed index ' + QUOTENAME(@index) + N' to ' + N'[Index_RowVersion]';
        END
    END
    -- Index_RowVersion on (RowVersion), clustered unless the table is a heap (the NServiceBus 8+ layout): a heap is kept, its index nonclustered (cluster_heaps rebuilds it)
    IF NOT EXISTS (SELECT 1 FROM sys.indexes AS i WHERE i.object_id = @object_id AND i.name = N'Index_RowVersion')
    BEGIN
        IF EXISTS (SELECT 1 FROM sys.indexes WHERE object_id = @object_id AND type IN (1, 5) AND name <> N'Index_RowVersion')
        BEGIN
            PRINT N'queue ' + N'[Legacy Queues].[orders-v1 queue.x]' + N': another clustered index exists; Index_RowVersion is created nonclustered';
            IF @online = 1
            BEGIN
                CREATE NONCLUSTERED INDEX [Index_RowVersion] ON [Legacy Queues].[orders-v1 queue.x] ([RowVersion]) WITH (ONLINE = ON);
            END
            ELSE
            BEGIN
                CREATE NONCLUSTERED INDEX [Index_RowVersion] ON [Legacy Queues].[orders-v1 queue.x] ([RowVersion]);
            END
        END
        ELSE
        BEGIN
            PRINT N'queue ' + N'[Legacy Queues].[orders-v1 queue.x]' + N': a heap (the NServiceBus 8+ layout); kept, Index_RowVersion nonclustered (rebuild it clustered with cluster_heaps)';
            IF @online = 1
            BEGIN
                CREATE NONCLUSTERED INDEX [Index_RowVersion] ON [Legacy Queues].[orders-v1 queue.x] ([RowVersion]) WITH (ONLINE = ON);
            END
            ELSE
            BEGIN
                CREATE NONCLUSTERED INDEX [Index_RowVersion] ON [Legacy Queues].[orders-v1 queue.x] ([RowVersion]);
            END
        END
    END
    ELSE
    BEGIN
        IF EXISTS (SELECT 1 FROM sys.indexes AS i WHERE i.object_id = @object_id AND i.name = N'Index_RowVersion' AND i.type <> 1) AND NOT EXISTS (SELECT 1 FROM sys.indexes WHERE object_id = @object_id AND type IN (1, 5) AND name <> N'Index_RowVersion')
        BEGIN
            PRINT N'queue ' + N'[Legacy Queues].[orders-v1 queue.x]' + N': a heap (the NServiceBus 8+ layout); kept, Index_RowVersion nonclustered (rebuild it clustered with cluster_heaps)';
            IF EXISTS (SELECT 1 FROM sys.indexes AS i WHERE i.object_id = @object_id AND i.name = N'Index_RowVersion' AND NOT (EXISTS (SELECT 1 FROM sys.index_columns AS ic JOIN sys.columns AS c ON c.object_id = ic.object_id AND c.column_id = ic.column_id WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.key_ordinal = 1 AND c.name = N'RowVersion') AND NOT EXISTS (SELECT 1 FROM sys.index_columns AS ic WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.key_ordinal > 1)))
            BEGIN
                IF @online = 1
                BEGIN
                    CREATE NONCLUSTERED INDEX [Index_RowVersion] ON [Legacy Queues].[orders-v1 queue.x] ([RowVersion]) WITH (DROP_EXISTING = ON, ONLINE = ON);
                END
                ELSE
                BEGIN
                    CREATE NONCLUSTERED INDEX [Index_RowVersion] ON [Legacy Queues].[orders-v1 queue.x] ([RowVersion]) WITH (DROP_EXISTING = ON);
                END
            END
        END
        ELSE
        BEGIN
            IF EXISTS (SELECT 1 FROM sys.indexes AS i WHERE i.object_id = @object_id AND i.name = N'Index_RowVersion' AND i.type = 1 AND NOT (EXISTS (SELECT 1 FROM sys.index_columns AS ic JOIN sys.columns AS c ON c.object_id = ic.object_id AND c.column_id = ic.column_id WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.key_ordinal = 1 AND c.name = N'RowVersion') AND NOT EXISTS (SELECT 1 FROM sys.index_columns AS ic WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.key_ordinal > 1)))
            BEGIN
                IF @online = 1
                BEGIN
                    CREATE CLUSTERED INDEX [Index_RowVersion] ON [Legacy Queues].[orders-v1 queue.x] ([RowVersion]) WITH (DROP_EXISTING = ON, ONLINE = ON);
                END
                ELSE
                BEGIN
                    CREATE CLUSTERED INDEX [Index_RowVersion] ON [Legacy Queues].[orders-v1 queue.x] ([RowVersion]) WITH (DROP_EXISTING = ON);
                END
            END
        END
    END
    -- OPTIMIZE_FOR_SEQUENTIAL_KEY: SQL Server 2019+ and Azure SQL only
    IF COL_LENGTH(N'sys.indexes', N'optimize_for_sequential_key') IS NOT NULL
    BEGIN
        SET @flag = 0;
        EXEC sp_executesql N'SELECT @flag = 1 FROM sys.indexes WHERE object_id = @object_id AND name = N''Index_RowVersion'' AND optimize_for_sequential_key = 0', N'@object_id int, @flag bit OUTPUT', @object_id = @object_id, @flag = @flag OUTPUT;
        IF @flag = 1
        BEGIN
            EXEC sp_executesql N'ALTER INDEX [Index_RowVersion] ON [Legacy Queues].[orders-v1 queue.x] SET (OPTIMIZE_FOR_SEQUENTIAL_KEY = ON)';
        END
    END
    COMMIT TRANSACTION;
END;

GO

-- queue o'brien] q@[sa]]les]: 0004_rowversion_layout upgrade: RowVersion and Index_RowVersion to the current layout
SET NOCOUNT ON; SET XACT_ABORT ON; SET NUMERIC_ROUNDABORT OFF;
SET ANSI_PADDING, ANSI_WARNINGS, CONCAT_NULL_YIELDS_NULL, ARITHABORT, QUOTED_IDENTIFIER, ANSI_NULLS ON;
DECLARE @object_id int = OBJECT_ID(N'[sa]]les].[o''brien]] q]', N'U');
DECLARE @online bit = CASE WHEN CAST(SERVERPROPERTY('EngineEdition') AS int) IN (3, 5, 8) THEN 1 ELSE 0 END;
DECLARE @index sysname, @sql nvarchar(max), @message nvarchar(2048), @flag bit;
IF @object_id IS NULL OR (SELECT COUNT(*) FROM sys.columns WHERE object_id = @object_id AND name IN (N'Id', N'Expires', N'Headers', N'Body', N'RowVersion')) < 5
BEGIN
    PRINT N'queue ' + N'[sa]]les].[o''brien]] q]' + N': no queue table there; skipped';
END
ELSE
BEGIN
    BEGIN TRANSACTION;
    -- adopt an index on (RowVersion) that has another name
    IF NOT EXISTS (SELECT 1 FROM sys.indexes AS i WHERE i.object_id = @object_id AND i.name = N'Index_RowVersion')
    BEGIN
        SET @index = NULL;
        SELECT TOP (1) @index = i.name FROM sys.indexes AS i
        WHERE i.object_id = @object_id AND i.type IN (1, 2) AND i.is_unique = 0 AND i.is_hypothetical = 0
            AND EXISTS (SELECT 1 FROM sys.index_columns AS ic JOIN sys.columns AS c ON c.object_id = ic.object_id AND c.column_id = ic.column_id WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.key_ordinal = 1 AND c.name = N'RowVersion') AND NOT EXISTS (SELECT 1 FROM sys.index_columns AS ic WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.key_ordinal > 1)
        ORDER BY i.type, i.index_id;
        IF @index IS NOT NULL
        BEGIN
            SET @sql = N'[sa]]les].[o''brien]] q]' + N'.' + QUOTENAME(@index);
            EXEC sp_rename @objname = @sql, @newname = N'Index_RowVersion', @objtype = N'INDEX';
            PRINT N'queue ' + N'[sa]]les].[o''brien]] q]' + N': renamed index ' + QUOTENAME(@index) + N' to ' + N'[Index_RowVersion]';
        END
    END
    -- Index_RowVersion on (RowVersion), clustered unless the table is a heap (the NServiceBus 8+ layout): a heap is kept, its index nonclustered (cluster_heaps rebuilds it)
    IF NOT EXISTS (SELECT 1 FROM sys.indexes AS i WHERE i.object_id = @object_id AND i.name = N'Index_RowVersion')
    BEGIN
        IF EXISTS (SELECT 1 FROM sys.indexes WHERE object_id = @object_id AND type IN (1, 5) AND name <> N'Index_RowVersion')
        BEGIN
            PRINT N'queue ' + N'[sa]]les].[o''brien]] q]' + N': another clustered index exists; Index_RowVersion is created nonclustered';
            IF @online = 1
            BEGIN
                CREATE NONCLUSTERED INDEX [Index_RowVersion] ON [sa]]les].[o'brien]] q] ([RowVersion]) WITH (ONLINE = ON);
            END
            ELSE
            BEGIN
                CREATE NONCLUSTERED INDEX [Index_RowVersion] ON [sa]]les].[o'brien]] q] ([RowVersion]);
            END
        END
        ELSE
        BEGIN
            PRINT N'queue ' + N'[sa]]les].[o''brien]] q]' + N': a heap (the NServiceBus 8+ layout); kept, Index_RowVersion nonclustered (rebuild it clustered with cluster_heaps)';
            IF @online = 1
            BEGIN
                CREATE NONCLUSTERED INDEX [Index_RowVersion] ON [sa]]les].[o'brien]] q] ([RowVersion]) WITH (ONLINE = ON);
            END
            ELSE
            BEGIN
                CREATE NONCLUSTERED INDEX [Index_RowVersion] ON [sa]]les].[o'brien]] q] ([RowVersion]);
            END
        END
    END
    ELSE
    BEGIN
        IF EXISTS (SELECT 1 FROM sys.indexes AS i WHERE i.object_id = @object_id AND i.name = N'Index_RowVersion' AND i.type <> 1) AND NOT EXISTS (SELECT 1 FROM sys.indexes WHERE object_id = @object_id AND type IN (1, 5) AND name <> N'Index_RowVersion')
        BEGIN
            PRINT N'queue ' + N'[sa]]les].[o''brien]] q]' + N': a heap (the NServiceBus 8+ layout); kept, Index_RowVersion nonclustered (rebuild it clustered with cluster_heaps)';
            IF EXISTS (SELECT 1 FROM sys.indexes AS i WHERE i.object_id = @object_id AND i.name = N'Index_RowVersion' AND NOT (EXISTS (SELECT 1 FROM sys.index_columns AS ic JOIN sys.columns AS c ON c.object_id = ic.object_id AND c.column_id = ic.column_id WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.key_ordinal = 1 AND c.name = N'RowVersion') AND NOT EXISTS (SELECT 1 FROM sys.index_columns AS ic WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.key_ordinal > 1)))
            BEGIN
                IF @online = 1
                BEGIN
                    CREATE NONCLUSTERED INDEX [Index_RowVersion] ON [sa]]les].[o'brien]] q] ([RowVersion]) WITH (DROP_EXISTING = ON, ONLINE = ON);
                END
                ELSE
                BEGIN
                    CREATE NONCLUSTERED INDEX [Index_RowVersion] ON [sa]]les].[o'brien]] q] ([RowVersion]) WITH (DROP_EXISTING = ON);
                END
            END
        END
        ELSE
        BEGIN
            IF EXISTS (SELECT 1 FROM sys.indexes AS i WHERE i.object_id = @object_id AND i.name = N'Index_RowVersion' AND i.type = 1 AND NOT (EXISTS (SELECT 1 FROM sys.index_columns AS ic JOIN sys.columns AS c ON c.object_id = ic.object_id AND c.column_id = ic.column_id WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.key_ordinal = 1 AND c.name = N'RowVersion') AND NOT EXISTS (SELECT 1 FROM sys.index_columns AS ic WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.key_ordinal > 1)))
            BEGIN
                IF @online = 1
                BEGIN
                    CREATE CLUSTERED INDEX [Index_RowVersion] ON [sa]]les].[o'brien]] q] ([RowVersion]) WITH (DROP_EXISTING = ON, ONLINE = ON);
                END
                ELSE
                BEGIN
                    CREATE CLUSTERED INDEX [Index_RowVersion] ON [sa]]les].[o'brien]] q] ([RowVersion]) WITH (DROP_EXISTING = ON);
                END
            END
        END
    END
    -- OPTIMIZE_FOR_SEQUENTIAL_KEY: SQL Server 2019+ and Azure SQL only
    IF COL_LENGTH(N'sys.indexes', N'optimize_for_sequential_key') IS NOT NULL
    BEGIN
        SET @flag = 0;
        EXEC sp_executesql N'SELECT @flag = 1 FROM sys.indexes WHERE object_id = @object_id AND name = N''Index_RowVersion'' AND optimize_for_sequential_key = 0', N'@object_id int, @flag bit OUTPUT', @object_id = @object_id, @flag = @flag OUTPUT;
        IF @flag = 1
        BEGIN
            EXEC sp_executesql N'ALTER INDEX [Index_RowVersion] ON [sa]]les].[o''brien]] q] SET (OPTIMIZE_FOR_SEQUENTIAL_KEY = ON)';
        END
    END
    COMMIT TRANSACTION;
END;

GO

BEGIN TRANSACTION;

UPDATE sqlqueue_alembic_version SET version_num='0004_rowversion_layout' WHERE sqlqueue_alembic_version.version_num = '0003_filter_expires_index';

GO

COMMIT;

GO

