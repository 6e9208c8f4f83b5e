-- Table river_leader: one leader per database runs maintenance (scheduler, cleaner).

-- name: leader_attempt_elect
-- Become leader if there is none or the last one's term expired. $1 leader id, $2 TTL seconds.
-- Returns the row when elected, nothing when another leader's term is still running.
INSERT INTO river_leader (name, leader_id, elected_at, expires_at)
VALUES ('default', $1, now(), now() + make_interval(secs => $2))
ON CONFLICT (name) DO UPDATE
    SET leader_id = EXCLUDED.leader_id,
        elected_at = EXCLUDED.elected_at,
        expires_at = EXCLUDED.expires_at
    WHERE river_leader.expires_at < now()
RETURNING leader_id, elected_at, expires_at;

-- name: leader_attempt_reelect
-- Extend our term if we still hold it. $1 leader id, $2 TTL seconds, $3 elected_at of our term.
UPDATE river_leader
SET expires_at = now() + make_interval(secs => $2)
WHERE name = 'default' AND leader_id = $1 AND elected_at = $3 AND expires_at >= now()
RETURNING leader_id, elected_at, expires_at;

-- name: leader_resign
-- Give up leadership (on stop); others are told through NOTIFY $2 at once. $1 leader id.
WITH resigned AS (
    DELETE FROM river_leader WHERE name = 'default' AND leader_id = $1 RETURNING leader_id
)
SELECT count(*) AS n, count(pg_notify($2, '{"action":"resigned"}')) AS notified FROM resigned;

-- name: leader_get
-- The current leader, if any.
SELECT leader_id, elected_at, expires_at FROM river_leader WHERE name = 'default';
