BEGIN TRANSACTION;

-- Running downgrade 0004_rowversion_layout -> 0003_filter_expires_index

COMMIT;

GO

-- queue orders-v1 queue.x@[Legacy Queues]: 0004_rowversion_layout downgrade: RowVersion and Index_RowVersion to the v1 layout
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
    -- OPTIMIZE_FOR_SEQUENTIAL_KEY: SQL Server 2019+ and Azure SQL only
    IF COL_LENGTH(N'sys.indexes', N'optimize_for_sequential_key') IS NOT NULL
    BEGIN
        SET @flag = 0;
        EXEC sp_executesql N'SELECT @flag = 1 FROM sys.indexes WHERE object_id = @object_id AND name = N''Index_RowVersion'' AND optimize_for_sequential_key = 1', N'@object_id int, @flag bit OUTPUT', @object_id = @object_id, @flag = @flag OUTPUT;
        IF @flag = 1
        BEGIN
            EXEC sp_executesql N'ALTER INDEX [Index_RowVersion] ON [Legacy Queues].[orders-v1 queue.x] SET (OPTIMIZE_FOR_SEQUENTIAL_KEY = OFF)';
        END
    END
    COMMIT TRANSACTION;
END;

GO

BEGIN TRANSACTION;

UPDATE sqlqueue_alembic_version SET version_num='0003_filter_expires_index' WHERE sqlqueue_alembic_version.version_num = '0004_rowversion_layout';

GO

COMMIT;

GO

BEGIN TRANSACTION;

-- Running downgrade 0003_filter_expires_index -> 0002_headers_nvarchar

COMMIT;

GO

-- queue orders-v1 queue.x@[Legacy Queues]: 0003_filter_expires_index downgrade: Index_Expires unfiltered
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
    IF EXISTS (SELECT 1 FROM sys.indexes AS i WHERE i.object_id = @object_id AND i.name = N'Index_Expires' AND i.has_filter = 1)
    BEGIN
        IF @online = 1
        BEGIN
            CREATE NONCLUSTERED INDEX [Index_Expires] ON [Legacy Queues].[orders-v1 queue.x] ([Expires]) INCLUDE ([Id], [RowVersion]) WITH (DROP_EXISTING = ON, ONLINE = ON);
        END
        ELSE
        BEGIN
            CREATE NONCLUSTERED INDEX [Index_Expires] ON [Legacy Queues].[orders-v1 queue.x] ([Expires]) INCLUDE ([Id], [RowVersion]) WITH (DROP_EXISTING = ON);
        END
    END
    COMMIT TRANSACTION;
END;

GO

BEGIN TRANSACTION;

UPDATE sqlqueue_alembic_version SET version_num='0002_headers_nvarchar' WHERE sqlqueue_alembic_version.version_num = '0003_filter_expires_index';

GO

COMMIT;

GO

BEGIN TRANSACTION;

-- Running downgrade 0002_headers_nvarchar -> 0001_expires_index

COMMIT;

GO

-- queue orders-v1 queue.x@[Legacy Queues]: 0002_headers_nvarchar downgrade: Headers back to varchar(max) / varchar
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
    -- refuse to lose characters: check every row first (the table stays locked)
    IF EXISTS (SELECT 1 FROM sys.columns AS c WHERE c.object_id = @object_id AND c.name = N'Headers' AND (TYPE_NAME(c.system_type_id) = N'nvarchar'))
    BEGIN
        SET @flag = 0;
        SELECT TOP (1) @flag = 1 FROM [Legacy Queues].[orders-v1 queue.x] WITH (TABLOCKX, HOLDLOCK) WHERE CAST(CAST(CAST([Headers] AS VARCHAR(max)) AS NVARCHAR(max)) AS VARBINARY(max)) <> CAST([Headers] AS VARBINARY(max));
        IF @flag = 1
        BEGIN
            SET @message = N'queue ' + N'[Legacy Queues].[orders-v1 queue.x]' + N': some Headers hold characters varchar cannot store; not downgraded';
            THROW 50000, @message, 1;
        END
        ALTER TABLE [Legacy Queues].[orders-v1 queue.x] ALTER COLUMN [Headers] VARCHAR(max) NOT NULL;
    END
    COMMIT TRANSACTION;
END;

GO

BEGIN TRANSACTION;

UPDATE sqlqueue_alembic_version SET version_num='0001_expires_index' WHERE sqlqueue_alembic_version.version_num = '0002_headers_nvarchar';

GO

COMMIT;

GO

BEGIN TRANSACTION;

-- Running downgrade 0001_expires_index -> 

COMMIT;

GO

-- queue orders-v1 queue.x@[Legacy Queues]: 0001_expires_index downgrade: drop Index_Expires
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
    IF EXISTS (SELECT 1 FROM sys.indexes AS i WHERE i.object_id = @object_id AND i.name = N'Index_Expires')
    BEGIN
        DROP INDEX [Index_Expires] ON [Legacy Queues].[orders-v1 queue.x];
    END
    COMMIT TRANSACTION;
END;

GO

BEGIN TRANSACTION;

DELETE FROM sqlqueue_alembic_version WHERE sqlqueue_alembic_version.version_num = '0001_expires_index';

GO

COMMIT;

GO

