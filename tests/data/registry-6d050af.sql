-- The registry database written by Corral at commit 6d050af10d5e261729da88569a4b4824ecccf27e (2026-11-29).
-- Made by tests/data/make_old_databases.py: that commit's own registry, scheduler and
-- two agents ran from a git worktree of it and were given jobs, a service and drained
-- nodes through their HTTP APIs; the file is Python's sqlite3 iterdump of the result.
-- tests/shared/test_migrations.py loads it into a new file and upgrades it in place.
--
BEGIN TRANSACTION;
CREATE TABLE "node" ("node_id" VARCHAR(128) NOT NULL PRIMARY KEY, "address" VARCHAR(255) NOT NULL, "kind" VARCHAR(32) NOT NULL, "slots" INTEGER NOT NULL, "cpus" INTEGER, "memory_mb" INTEGER, "max_memory_mb" INTEGER, "max_cpu_percent" INTEGER, "labels" TEXT NOT NULL, "registered_at" REAL NOT NULL, "last_heartbeat" REAL NOT NULL, "running" INTEGER, "drained" INTEGER NOT NULL);
INSERT INTO "node" VALUES('node-1','127.0.0.1','compute',2,2,24105,24105,200,'{}',1.79613471631220269209e+09,1.79613471783686470982e+09,1,0);
INSERT INTO "node" VALUES('node-2','127.0.0.1','compute',2,2,24105,24105,200,'{}',1.79613471636451911932e+09,1.79613471789610528945e+09,0,1);
CREATE TABLE "service" ("job_id" VARCHAR(64) NOT NULL PRIMARY KEY, "name" VARCHAR(255) NOT NULL, "node_id" VARCHAR(128) NOT NULL, "address" VARCHAR(255) NOT NULL, "port" INTEGER NOT NULL, "healthy" INTEGER, "checked_at" REAL, "registered_at" REAL NOT NULL);
INSERT INTO "service" VALUES('job-9','web','node-1','127.0.0.1',41583,1,1.7961347175020546913e+09,1.79613471719441437717e+09);
CREATE INDEX "node_kind" ON "node" ("kind");
CREATE INDEX "node_last_heartbeat" ON "node" ("last_heartbeat");
CREATE INDEX "service_name" ON "service" ("name");
CREATE INDEX "service_node_id" ON "service" ("node_id");
COMMIT;
