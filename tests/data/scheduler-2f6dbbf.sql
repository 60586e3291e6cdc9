-- The scheduler database written by Corral at commit 2f6dbbf0e473ea87b87338f5e3f597be8b9dd826 (2026-12-01).
-- Made by tests/data/make_old_databases.py: that commit's own registry, scheduler and
-- two agents ran from a git worktree of it and were given jobs, a service and drained
-- nodes through their HTTP APIs; the file is Python's sqlite3 iterdump of the result.
-- tests/shared/test_migrations.py loads it into a new file and upgrades it in place.
--
BEGIN TRANSACTION;
CREATE TABLE "counter" ("name" VARCHAR(64) NOT NULL PRIMARY KEY, "value" INTEGER NOT NULL);
CREATE TABLE "job" ("id" INTEGER NOT NULL PRIMARY KEY, "command" TEXT, "deploy_url" TEXT, "job_type" VARCHAR(16) NOT NULL, "port" INTEGER, "env_vars" TEXT NOT NULL, "instance_id" VARCHAR(128), "name" VARCHAR(128), "memory_mb" INTEGER, "cpu_percent" INTEGER, "max_processes" INTEGER, "deploy_sha256" VARCHAR(64), "health_path" VARCHAR(1024), "node_id" VARCHAR(128), "status" VARCHAR(16) NOT NULL CHECK (status IN ('pending', 'running', 'done', 'failed', 'cancelled')), "attempt" INTEGER NOT NULL, "retry_count" INTEGER NOT NULL, "max_retries" INTEGER NOT NULL, "next_attempt_at" REAL, "on_node_lost" VARCHAR(16) NOT NULL, "node_losses" INTEGER NOT NULL, "idempotency_key" VARCHAR(255), "request_hash" VARCHAR(64), "exit_code" INTEGER, "stdout" TEXT, "stderr" TEXT, "limits_enforced" INTEGER, "limits" TEXT, "private_tmp" INTEGER, "oom_killed" INTEGER, "peak_memory_bytes" INTEGER, "cpu_seconds" REAL, "created_at" REAL NOT NULL, "placed_at" REAL, "running_at" REAL, "finished_at" REAL);
INSERT INTO "job" VALUES(1,'echo hi',NULL,'run',NULL,'{}',NULL,NULL,NULL,NULL,NULL,NULL,NULL,'node-1','done',1,0,1,NULL,'requeue',0,NULL,NULL,0,'hi
','',0,NULL,0,0,NULL,NULL,1.79613472072351622581e+09,1.79613472072351622581e+09,1.79613472072822856909e+09,1.79613472073903203008e+09);
INSERT INTO "job" VALUES(2,'echo oops >&2; exit 3',NULL,'run',NULL,'{}',NULL,NULL,NULL,NULL,NULL,NULL,NULL,'node-1','failed',1,0,0,NULL,'requeue',0,NULL,NULL,3,'','oops
',0,NULL,0,0,NULL,NULL,1.79613472073114132884e+09,1.79613472073903203008e+09,1.79613472073903203008e+09,1.79613472075842809673e+09);
INSERT INTO "job" VALUES(3,'exit 1',NULL,'run',NULL,'{}',NULL,NULL,NULL,NULL,NULL,NULL,NULL,'node-1','failed',2,1,1,NULL,'requeue',0,NULL,NULL,1,'','',0,NULL,0,0,NULL,NULL,1.79613472074373292921e+09,1.79613472107098674779e+09,1.79613472107997345925e+09,1.79613472108800315855e+09);
INSERT INTO "job" VALUES(4,'echo $GREETING',NULL,'run',NULL,'{"GREETING": "hello"}',NULL,'every-field',64,50,NULL,NULL,NULL,'node-1','done',1,0,2,NULL,'fail',0,'make-old-databases-1','a4ff606d58489f786b11b558804c2c7ca1840f638830df17b5f0e07fa336e139',0,'hello
','',0,NULL,0,0,NULL,NULL,1.79613472074887251849e+09,1.79613472077184271815e+09,1.79613472077184271815e+09,1.79613472078110098838e+09);
INSERT INTO "job" VALUES(5,'echo batch 0',NULL,'run',NULL,'{}',NULL,NULL,NULL,NULL,NULL,NULL,NULL,'node-1','done',1,0,1,NULL,'requeue',0,NULL,NULL,0,'batch 0
','',0,NULL,0,0,NULL,NULL,1.79613472075481939312e+09,1.79613472078110098838e+09,1.79613472078110098838e+09,1.79613472078904247279e+09);
INSERT INTO "job" VALUES(6,'echo batch 1',NULL,'run',NULL,'{}',NULL,NULL,NULL,NULL,NULL,NULL,NULL,'node-1','done',1,0,1,NULL,'requeue',0,NULL,NULL,0,'batch 1
','',0,NULL,0,0,NULL,NULL,1.79613472075481939312e+09,1.79613472078904247279e+09,1.79613472078904247279e+09,1.79613472079848575596e+09);
INSERT INTO "job" VALUES(7,'echo batch 2',NULL,'run',NULL,'{}',NULL,NULL,NULL,NULL,NULL,NULL,NULL,'node-1','done',1,0,1,NULL,'requeue',0,NULL,NULL,0,'batch 2
','',0,NULL,0,0,NULL,NULL,1.79613472075481939312e+09,1.79613472079848575596e+09,1.79613472079848575596e+09,1.79613472080721473696e+09);
INSERT INTO "job" VALUES(8,'sleep 300',NULL,'run',NULL,'{}',NULL,NULL,NULL,NULL,NULL,NULL,NULL,'node-1','cancelled',1,0,1,NULL,'requeue',0,NULL,NULL,NULL,NULL,NULL,0,NULL,0,NULL,NULL,NULL,1.79613472110886907579e+09,1.79613472110886907579e+09,1.79613472111249661443e+09,1.79613472111740231514e+09);
INSERT INTO "job" VALUES(9,'exec python3 -m http.server --bind 127.0.0.1 $PORT',NULL,'service',34329,'{}',NULL,'web',NULL,NULL,NULL,NULL,'/','node-1','running',1,0,1,NULL,'requeue',0,NULL,NULL,NULL,NULL,NULL,0,NULL,0,NULL,NULL,NULL,1.79613472112536668779e+09,1.79613472112536668779e+09,1.79613472112721419332e+09,NULL);
INSERT INTO "job" VALUES(10,'echo never placed',NULL,'run',NULL,'{}',NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,'pending',0,0,1,NULL,'requeue',0,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,1.79613472152655339244e+09,NULL,NULL,NULL);
INSERT INTO "job" VALUES(11,'true',NULL,'run',NULL,'{}',NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,'pending',0,0,1,NULL,'requeue',0,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,1.79613472153110480308e+09,NULL,NULL,NULL);
INSERT INTO "job" VALUES(12,'false',NULL,'run',NULL,'{}',NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,'pending',0,0,1,NULL,'requeue',0,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,1.79613472153110480308e+09,NULL,NULL,NULL);
CREATE TABLE "job_event" ("id" INTEGER NOT NULL PRIMARY KEY, "job_id" INTEGER NOT NULL, "at" REAL NOT NULL, "from_status" VARCHAR(16), "to_status" VARCHAR(16) NOT NULL, "attempt" INTEGER NOT NULL, "node_id" VARCHAR(128), "reason" TEXT NOT NULL, FOREIGN KEY ("job_id") REFERENCES "job" ("id") ON DELETE CASCADE);
INSERT INTO "job_event" VALUES(1,1,1.79613472072351622581e+09,NULL,'pending',0,NULL,'submitted');
INSERT INTO "job_event" VALUES(2,1,1.79613472072351622581e+09,'pending','pending',1,'node-1','placed on node-1');
INSERT INTO "job_event" VALUES(3,1,1.79613472072822856909e+09,'pending','running',1,'node-1','claimed by the node');
INSERT INTO "job_event" VALUES(4,2,1.79613472073114132884e+09,NULL,'pending',0,NULL,'submitted');
INSERT INTO "job_event" VALUES(5,1,1.79613472073903203008e+09,'running','done',1,'node-1','exit code 0');
INSERT INTO "job_event" VALUES(6,2,1.79613472073903203008e+09,'pending','pending',1,'node-1','placed on node-1');
INSERT INTO "job_event" VALUES(7,2,1.79613472073903203008e+09,'pending','running',1,'node-1','claimed by the node');
INSERT INTO "job_event" VALUES(8,3,1.79613472074373292921e+09,NULL,'pending',0,NULL,'submitted');
INSERT INTO "job_event" VALUES(9,4,1.79613472074887251849e+09,NULL,'pending',0,NULL,'submitted');
INSERT INTO "job_event" VALUES(10,5,1.79613472075481939312e+09,NULL,'pending',0,NULL,'submitted');
INSERT INTO "job_event" VALUES(11,6,1.79613472075481939312e+09,NULL,'pending',0,NULL,'submitted');
INSERT INTO "job_event" VALUES(12,7,1.79613472075481939312e+09,NULL,'pending',0,NULL,'submitted');
INSERT INTO "job_event" VALUES(13,2,1.79613472075842809673e+09,'running','failed',1,'node-1','exit code 3; no retries left');
INSERT INTO "job_event" VALUES(14,3,1.79613472075842809673e+09,'pending','pending',1,'node-1','placed on node-1');
INSERT INTO "job_event" VALUES(15,3,1.79613472075842809673e+09,'pending','running',1,'node-1','claimed by the node');
INSERT INTO "job_event" VALUES(16,3,1.79613472077184271815e+09,'running','pending',1,'node-1','attempt 1 failed (exit code 1); retrying in 0.1s');
INSERT INTO "job_event" VALUES(17,4,1.79613472077184271815e+09,'pending','pending',1,'node-1','placed on node-1');
INSERT INTO "job_event" VALUES(18,4,1.79613472077184271815e+09,'pending','running',1,'node-1','claimed by the node');
INSERT INTO "job_event" VALUES(19,4,1.79613472078110098838e+09,'running','done',1,'node-1','exit code 0');
INSERT INTO "job_event" VALUES(20,5,1.79613472078110098838e+09,'pending','pending',1,'node-1','placed on node-1');
INSERT INTO "job_event" VALUES(21,5,1.79613472078110098838e+09,'pending','running',1,'node-1','claimed by the node');
INSERT INTO "job_event" VALUES(22,5,1.79613472078904247279e+09,'running','done',1,'node-1','exit code 0');
INSERT INTO "job_event" VALUES(23,6,1.79613472078904247279e+09,'pending','pending',1,'node-1','placed on node-1');
INSERT INTO "job_event" VALUES(24,6,1.79613472078904247279e+09,'pending','running',1,'node-1','claimed by the node');
INSERT INTO "job_event" VALUES(25,6,1.79613472079848575596e+09,'running','done',1,'node-1','exit code 0');
INSERT INTO "job_event" VALUES(26,7,1.79613472079848575596e+09,'pending','pending',1,'node-1','placed on node-1');
INSERT INTO "job_event" VALUES(27,7,1.79613472079848575596e+09,'pending','running',1,'node-1','claimed by the node');
INSERT INTO "job_event" VALUES(28,7,1.79613472080721473696e+09,'running','done',1,'node-1','exit code 0');
INSERT INTO "job_event" VALUES(29,3,1.79613472107098674779e+09,'pending','pending',2,'node-1','placed on node-1');
INSERT INTO "job_event" VALUES(30,3,1.79613472107997345925e+09,'pending','running',2,'node-1','claimed by the node');
INSERT INTO "job_event" VALUES(31,3,1.79613472108800315855e+09,'running','failed',2,'node-1','exit code 1; no retries left');
INSERT INTO "job_event" VALUES(32,8,1.79613472110886907579e+09,NULL,'pending',0,NULL,'submitted');
INSERT INTO "job_event" VALUES(33,8,1.79613472110886907579e+09,'pending','pending',1,'node-1','placed on node-1');
INSERT INTO "job_event" VALUES(34,8,1.79613472111249661443e+09,'pending','running',1,'node-1','claimed by the node');
INSERT INTO "job_event" VALUES(35,8,1.79613472111740231514e+09,'running','cancelled',1,'node-1','cancelled by request');
INSERT INTO "job_event" VALUES(36,9,1.79613472112536668779e+09,NULL,'pending',0,NULL,'submitted');
INSERT INTO "job_event" VALUES(37,9,1.79613472112536668779e+09,'pending','pending',1,'node-1','placed on node-1');
INSERT INTO "job_event" VALUES(38,9,1.79613472112721419332e+09,'pending','running',1,'node-1','claimed by the node');
INSERT INTO "job_event" VALUES(39,10,1.79613472152655339244e+09,NULL,'pending',0,NULL,'submitted');
INSERT INTO "job_event" VALUES(40,11,1.79613472153110480308e+09,NULL,'pending',0,NULL,'submitted');
INSERT INTO "job_event" VALUES(41,12,1.79613472153110480308e+09,NULL,'pending',0,NULL,'submitted');
CREATE TABLE "lease" ("name" VARCHAR(64) NOT NULL PRIMARY KEY, "holder" VARCHAR(128), "expires_at" REAL NOT NULL, "token" INTEGER NOT NULL);
INSERT INTO "lease" VALUES('scheduler-loops','vm:7294:8710200d',0.0,1);
CREATE TABLE "node" ("node_id" VARCHAR(128) NOT NULL PRIMARY KEY, "address" VARCHAR(255) NOT NULL, "kind" VARCHAR(32) NOT NULL, "slots" INTEGER NOT NULL, "max_memory_mb" INTEGER, "max_cpu_percent" INTEGER, "status" VARCHAR(16) NOT NULL, "drained" INTEGER NOT NULL, "last_heartbeat" REAL, "synced_at" REAL NOT NULL);
INSERT INTO "node" VALUES('node-1','127.0.0.1','compute',2,24105,200,'healthy',0,1796134721.097,1.79613472188966202735e+09);
INSERT INTO "node" VALUES('node-2','127.0.0.1','compute',2,24105,200,'drained',1,1796134721.54,1.79613472188966202735e+09);
CREATE TABLE "node_lease" ("node_id" VARCHAR(128) NOT NULL PRIMARY KEY, "renewed_at" REAL NOT NULL);
INSERT INTO "node_lease" VALUES('node-2',1.79613472002621650698e+09);
INSERT INTO "node_lease" VALUES('node-1',1.79613472112721419332e+09);
CREATE TABLE "scheduler_state" ("key" VARCHAR(64) NOT NULL PRIMARY KEY, "value" TEXT);
INSERT INTO "scheduler_state" VALUES('rr_cursor','node-1');
INSERT INTO "scheduler_state" VALUES('placement_mark','422a6b0ca81559c0');
CREATE TABLE "sns_outbox" ("id" INTEGER NOT NULL PRIMARY KEY, "event_id" VARCHAR(128) NOT NULL, "job_id" INTEGER NOT NULL, "status" VARCHAR(16) NOT NULL, "message" TEXT NOT NULL, "created_at" REAL NOT NULL, "published_at" REAL, "publish_attempts" INTEGER NOT NULL, "last_error" TEXT);
CREATE UNIQUE INDEX "job_idempotency_key" ON "job" ("idempotency_key");
CREATE INDEX "job_status_node_id" ON "job" ("status", "node_id");
CREATE INDEX "job_node_id_status" ON "job" ("node_id", "status");
CREATE INDEX "job_finished_at" ON "job" ("finished_at");
CREATE INDEX "jobevent_job_id" ON "job_event" ("job_id");
CREATE UNIQUE INDEX "outboxevent_event_id" ON "sns_outbox" ("event_id");
CREATE INDEX "outboxevent_published_at_id" ON "sns_outbox" ("published_at", "id");
COMMIT;
