# Sourced by the bench scripts (bench.sh, bench-linearity.sh): how they
# time a statement and summarize runs.

# The median of the numbers on stdin, one a line.
median() { sort -g | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# bench_ms(statement): its wall time in ms, measured inside the backend.
# shellcheck disable=SC2034 # used by the scripts that source this one
BENCH_MS_SQL='CREATE FUNCTION bench_ms(statement text) RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE t0 timestamptz := clock_timestamp();
BEGIN
    EXECUTE statement;
    RETURN extract(epoch FROM clock_timestamp() - t0) * 1000;
END $$'
