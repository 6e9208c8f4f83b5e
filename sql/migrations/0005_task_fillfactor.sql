-- Room on each engine_task page for updated row versions. Most writes to a running task (the
-- submission mark, the upstream reference, lease renewals, phase changes) touch no indexed
-- column, so with free space on the page they are HOT updates: one heap write instead of one
-- heap write plus an entry in each of the table's five indexes. Applies to pages written from
-- now on (an existing table is not rewritten).
ALTER TABLE engine_task SET (fillfactor = 70);
