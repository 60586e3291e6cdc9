"""Fair share's index of the jobs waiting by team (job_waiting_by_team, 0027) is kept
only where a team other than `default` exists: a cluster of one team takes no turns
and would pay its upkeep on every submit and placement for nothing. The first team
created makes it again (scheduler.models.add_waiting_by_team_index)."""


def up(migrator, db):
    teams = db.execute_sql('SELECT COUNT(*) FROM "team"').fetchone()[0]
    if teams <= 1:
        db.execute_sql('DROP INDEX IF EXISTS "job_waiting_by_team"')
