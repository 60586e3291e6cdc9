-- The registry database written by Corral at commit 2f6dbbf0e473ea87b87338f5e3f597be8b9dd826 (2026-12-01).
-- Made by tests/data/make_old_databases.py: that commit's own registry, scheduler and
-- two agents ran from a git worktree of it and were given jobs, a service and drained
-- nodes through their HTTP APIs; the file is Python's sqlite3 iterdump of the result.
-- tests/shared/test_migrations.py loads it into a new file and upgrades it in place.
--
BEGIN TRANSACTION;
CREATE TABLE "node" ("node_id" VARCHAR(128) NOT NULL PRIMARY KEY, "address" VARCHAR(255) NOT NULL, "kind" VARCHAR(32) NOT NULL, "slots" INTEGER NOT NULL, "cpus" INTEGER, "memory_mb" INTEGER, "max_memory_mb" INTEGER, "max_cpu_percent" INTEGER, "labels" TEXT NOT NULL, "registered_at" REAL NOT NULL, "last_heartbeat" REAL NOT NULL, "running" INTEGER, "drained" INTEGER NOT NULL);
INSERT INTO "node" VALUES('node-2','127.0.0.1','compute',2,2,24105,24105,200,'{}',1.79613472001312446599e+09,1.79613472154073238375e+09,0,1);
INSERT INTO "node" VALUES('node-1','127.0.0.1','compute',2,2,24105,24105,200,'{}',1.79613472008111786843e+09,1.79613472109770751002e+09,0,0);
CREATE TABLE "service" ("job_id" VARCHAR(64) NOT NULL PRIMARY KEY, "name" VARCHAR(255) NOT NULL, "node_id" VARCHAR(128) NOT NULL, "address" VARCHAR(255) NOT NULL, "port" INTEGER NOT NULL, "attempt" INTEGER, "healthy" INTEGER, "checked_at" REAL, "registered_at" REAL NOT NULL);
INSERT INTO "service" VALUES('job-9','web','node-1','127.0.0.1',34329,1,1,1.79613472144573736192e+09,1.79613472113775753972e+09);
CREATE INDEX "node_kind" ON "node" ("kind");
CREATE INDEX "node_last_heartbeat" ON "node" ("last_heartbeat");
CREATE INDEX "service_name" ON "service" ("name");
CREATE INDEX "service_node_id" ON "service" ("node_id");
COMMIT;
