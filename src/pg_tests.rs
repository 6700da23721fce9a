//! `#[pg_test]`: SPEC §1–§5 behaviour seen from one session. Each test runs
//! inside one transaction that is rolled back at its end, so commit and
//! concurrency rules live in the integration tier (tests/integration) and
//! what users see in tests/pg_regress.

#[pgrx::pg_schema]
mod tests {

    use pgrx::prelude::*;

    extension_sql!(
        r#"
    -- The SQLSTATE a statement fails with, or NULL if it succeeds; the failed
    -- statement's effects are rolled back with the EXCEPTION block.
    CREATE FUNCTION tests.sqlstate_of(statement text) RETURNS text LANGUAGE plpgsql AS $$
    BEGIN
        EXECUTE statement;
        RETURN NULL;
    EXCEPTION WHEN OTHERS THEN
        RETURN SQLSTATE;
    END $$;
    "#,
        name = "test_helpers"
    );

    fn one_i64(sql: &str) -> i64 {
        Spi::get_one::<i64>(sql).expect("query ran").expect("not null")
    }

    fn sqlstate_of(statement: &str) -> Option<String> {
        Spi::get_one_with_args::<String>("SELECT tests.sqlstate_of($1)", &[statement.into()]).expect("helper ran")
    }

    #[pg_test]
    fn scope_starts_at_one_and_counts_up() {
        assert_eq!(one_i64("SELECT current_scoped_id('t-first', 'd')"), 0, "0 means never used");
        assert_eq!(one_i64("SELECT next_scoped_id('t-first', 'd')"), 1);
        assert_eq!(one_i64("SELECT next_scoped_id('t-first', 'd')"), 2);
        assert_eq!(one_i64("SELECT current_scoped_id('t-first', 'd')"), 2);
    }

    #[pg_test]
    fn scopes_are_independent_and_values_repeat_across_them() {
        assert_eq!(one_i64("SELECT next_scoped_id('t-indep', 'request')"), 1);
        assert_eq!(one_i64("SELECT next_scoped_id('t-indep', 'request')"), 2);
        assert_eq!(one_i64("SELECT next_scoped_id('t-indep', 'batch')"), 1);
        assert_eq!(one_i64("SELECT next_scoped_id('t-indep-2', 'request')"), 1);
        // A block name never shares a mark with a scope.
        assert_eq!(one_i64("SELECT first_id FROM reserve_block('t-indep', 1)"), 1);
    }

    #[pg_test]
    fn the_text_of_an_id_is_its_decimal_string() {
        let text = Spi::get_one::<String>("SELECT '/queues/demo-queue/requests/' || next_scoped_id('t-text', 'requests')::text")
            .unwrap()
            .unwrap();
        assert_eq!(text, "/queues/demo-queue/requests/1");
    }

    #[pg_test]
    fn an_exception_block_gives_its_values_back() {
        assert_eq!(one_i64("SELECT next_scoped_id('t-exc', 'd')"), 1);
        Spi::run(
            "DO $$ BEGIN
                PERFORM next_scoped_id('t-exc', 'd');
                PERFORM next_scoped_id('t-exc', 'new-in-block');
                RAISE EXCEPTION 'boom';
             EXCEPTION WHEN raise_exception THEN NULL;
             END $$",
        )
        .unwrap();
        assert_eq!(one_i64("SELECT next_scoped_id('t-exc', 'd')"), 2, "the value taken in the failed block is handed out again");
        assert_eq!(one_i64("SELECT next_scoped_id('t-exc', 'new-in-block')"), 1, "a scope first used in the failed block starts over");
    }

    #[pg_test]
    fn nested_exception_blocks_restore_their_own_values() {
        Spi::run(
            "CREATE TEMP TABLE seen(label text, v bigint);
             DO $$ BEGIN
                INSERT INTO seen VALUES ('a', next_scoped_id('t-nest', 'd'));       -- 1
                BEGIN
                    INSERT INTO seen VALUES ('b', next_scoped_id('t-nest', 'd'));   -- 2, kept
                    BEGIN
                        PERFORM next_scoped_id('t-nest', 'd');                    -- 3, given back
                        PERFORM next_scoped_id('t-nest', 'd');                    -- 4, given back
                        RAISE EXCEPTION 'inner';
                    EXCEPTION WHEN raise_exception THEN NULL;
                    END;
                    INSERT INTO seen VALUES ('c', next_scoped_id('t-nest', 'd'));   -- 3 again
                END;
                BEGIN
                    PERFORM next_scoped_id('t-nest', 'd');                        -- 4, given back
                    RAISE EXCEPTION 'outer';
                EXCEPTION WHEN raise_exception THEN NULL;
                END;
                INSERT INTO seen VALUES ('d', next_scoped_id('t-nest', 'd'));       -- 4 again
             END $$",
        )
        .unwrap();
        let got = Spi::get_one::<String>("SELECT string_agg(label || v, ',' ORDER BY label) FROM seen").unwrap().unwrap();
        assert_eq!(got, "a1,b2,c3,d4");
    }

    #[pg_test]
    fn a_loop_of_many_ids_in_one_transaction_has_no_gap() {
        let (count, min, max) = Spi::get_three::<i64, i64, i64>(
            "SELECT count(DISTINCT v), min(v), max(v) FROM (SELECT next_scoped_id('t-loop', 'd') AS v FROM generate_series(1, 50000)) s",
        )
        .unwrap();
        assert_eq!((count, min, max), (Some(50000), Some(1), Some(50000)));
    }

    #[pg_test]
    fn default_expressions_number_rows() {
        Spi::run(
            "CREATE TABLE invoices (
                no bigint DEFAULT next_scoped_id('invoices', '2026'),
                key bigint DEFAULT snowflake_id(),
                item text);
             INSERT INTO invoices(item) SELECT 'item ' || i FROM generate_series(1, 5) i",
        )
        .unwrap();
        let nos = Spi::get_one::<String>("SELECT string_agg(no::text, ',' ORDER BY no) FROM invoices").unwrap().unwrap();
        assert_eq!(nos, "1,2,3,4,5");
        let ordered = Spi::get_one::<bool>(
            "SELECT bool_and(k > lag_k) FROM (SELECT key AS k, lag(key) OVER (ORDER BY no) AS lag_k FROM invoices) s WHERE lag_k IS NOT NULL",
        )
        .unwrap();
        assert_eq!(ordered, Some(true), "snowflake keys follow insertion order");
    }

    #[pg_test]
    fn reserve_block_hands_out_consecutive_ranges() {
        assert_eq!(Spi::get_two::<i64, i64>("SELECT * FROM reserve_block('t-block', 3)").unwrap(), (Some(1), Some(3)));
        assert_eq!(Spi::get_two::<i64, i64>("SELECT * FROM reserve_block('t-block', 3)").unwrap(), (Some(4), Some(6)));
        assert_eq!(Spi::get_two::<i64, i64>("SELECT * FROM reserve_block('t-block', 1)").unwrap(), (Some(7), Some(7)));
        assert_eq!(one_i64("SELECT current_block_mark('t-block')"), 7);
    }

    #[pg_test]
    fn null_arguments_fail_with_22004() {
        for stmt in [
            "SELECT next_scoped_id(NULL, 'd')",
            "SELECT next_scoped_id('q', NULL)",
            "SELECT reserve_block(NULL, 1)",
            "SELECT reserve_block('b', NULL)",
            "SELECT current_scoped_id(NULL, 'd')",
            "SELECT snowflake_decode(NULL)",
            "SELECT pgticket.advance_scoped_id('q', 'd', NULL)",
        ] {
            assert_eq!(sqlstate_of(stmt).as_deref(), Some("22004"), "{stmt}");
        }
    }

    #[pg_test]
    fn bad_names_and_sizes_fail_with_22023_and_change_nothing() {
        let long = "x".repeat(256);
        for stmt in [
            "SELECT next_scoped_id('', 'd')".to_string(),
            "SELECT next_scoped_id('q', '')".to_string(),
            format!("SELECT next_scoped_id('{long}', 'd')"),
            format!("SELECT next_scoped_id('q', '{long}')"),
            "SELECT reserve_block('', 1)".to_string(),
            "SELECT reserve_block('t-bad', 0)".to_string(),
            "SELECT reserve_block('t-bad', -1)".to_string(),
            "SELECT reserve_block('t-bad', 9223372036854775807)".to_string(),
            "SELECT snowflake_decode(-1)".to_string(),
        ] {
            assert_eq!(sqlstate_of(&stmt).as_deref(), Some("22023"), "{stmt}");
        }
        assert_eq!(one_i64(&format!("SELECT next_scoped_id('q', '{}')", "x".repeat(255))), 1, "255 bytes is allowed");
        assert_eq!(one_i64("SELECT current_block_mark('t-bad')"), 0, "refused reservations took nothing");
        assert_eq!(one_i64("SELECT count(*) FROM pgticket.blocks WHERE name = 't-bad'"), 0);
    }

    #[pg_test]
    fn counters_and_blocks_stop_at_the_top_with_2200h() {
        assert_eq!(one_i64("SELECT pgticket.advance_scoped_id('t-top', 'd', 9223372036854775806)"), i64::MAX - 1);
        assert_eq!(one_i64("SELECT next_scoped_id('t-top', 'd')"), i64::MAX);
        assert_eq!(sqlstate_of("SELECT next_scoped_id('t-top', 'd')").as_deref(), Some("2200H"));
        assert_eq!(one_i64("SELECT current_scoped_id('t-top', 'd')"), i64::MAX, "the mark is left as it was");

        one_i64("SELECT pgticket.advance_block('t-top', 9223372036854775805)");
        assert_eq!(sqlstate_of("SELECT reserve_block('t-top', 3)").as_deref(), Some("2200H"));
        assert_eq!(one_i64("SELECT current_block_mark('t-top')"), i64::MAX - 2);
        assert_eq!(Spi::get_two::<i64, i64>("SELECT * FROM reserve_block('t-top', 2)").unwrap(), (Some(i64::MAX - 1), Some(i64::MAX)));
    }

    #[pg_test]
    fn marks_move_forward_never_back() {
        assert_eq!(one_i64("SELECT pgticket.advance_scoped_id('t-adv', 'd', 100)"), 100);
        assert_eq!(one_i64("SELECT next_scoped_id('t-adv', 'd')"), 101);
        assert_eq!(sqlstate_of("SELECT pgticket.advance_scoped_id('t-adv', 'd', 50)").as_deref(), Some("22023"));
        assert_eq!(one_i64("SELECT pgticket.advance_scoped_id('t-adv', 'd', 101)"), 101, "moving to the same mark is allowed");
        assert_eq!(one_i64("SELECT next_scoped_id('t-adv', 'd')"), 102);
        assert_eq!(one_i64("SELECT pgticket.advance_block('t-adv', 10)"), 10);
        assert_eq!(sqlstate_of("SELECT pgticket.advance_block('t-adv', 9)").as_deref(), Some("22023"));
        assert_eq!(Spi::get_two::<i64, i64>("SELECT * FROM reserve_block('t-adv', 5)").unwrap(), (Some(11), Some(15)));
    }

    #[pg_test]
    fn allocation_in_a_read_only_transaction_fails_with_25006() {
        Spi::run("SET LOCAL transaction_read_only = on").unwrap();
        assert_eq!(sqlstate_of("SELECT next_scoped_id('t-ro', 'd')").as_deref(), Some("25006"));
        assert_eq!(sqlstate_of("SELECT reserve_block('t-ro', 1)").as_deref(), Some("25006"));
        assert_eq!(sqlstate_of("SELECT pgticket.advance_scoped_id('t-ro', 'd', 5)").as_deref(), Some("25006"));
        assert_eq!(one_i64("SELECT current_scoped_id('t-ro', 'd')"), 0, "reading a mark is fine");
    }

    #[pg_test]
    fn snowflake_decode_reads_the_spec_worked_example() {
        let id: i64 = 24_000_000_000 * (1 << 22) + 7 * (1 << 12) + 3;
        let (ms, machine, seq) = Spi::get_three_with_args::<i64, i32, i32>(
            "SELECT (extract(epoch FROM created_at - '2026-01-01 00:00:00+00'::timestamptz) * 1000)::bigint, machine_id, sequence
               FROM snowflake_decode($1)",
            &[id.into()],
        )
        .unwrap();
        assert_eq!((ms, machine, seq), (Some(24_000_000_000), Some(7), Some(3)));
    }

    #[pg_test]
    fn snowflake_ids_increase_and_decode_to_now() {
        let ok = Spi::get_one::<bool>(
            "WITH ids AS (SELECT g, snowflake_id() AS id FROM generate_series(1, 20000) g)
             SELECT bool_and(id > prev) FROM (SELECT id, lag(id) OVER (ORDER BY g) AS prev FROM ids) s WHERE prev IS NOT NULL",
        )
        .unwrap();
        assert_eq!(ok, Some(true), "strictly increasing in issue order");
        let (machine, close) = Spi::get_two::<i32, bool>(
            "SELECT machine_id, abs(extract(epoch FROM created_at - clock_timestamp())) < 5 FROM snowflake_decode(snowflake_id())",
        )
        .unwrap();
        assert_eq!(machine, Some(0), "default machine id");
        assert_eq!(close, Some(true), "the timestamp is the current time");
    }

    #[pg_test]
    fn no_millisecond_holds_more_than_4096_snowflakes() {
        let (max_per_ms, dup_seqs) = Spi::get_two::<i64, i64>(
            "WITH d AS (SELECT (snowflake_decode(snowflake_id())).* FROM generate_series(1, 30000))
             SELECT max(n), sum(n - distinct_seq)::bigint FROM (
                 SELECT created_at, count(*) AS n, count(DISTINCT sequence) AS distinct_seq FROM d GROUP BY created_at) per_ms",
        )
        .unwrap();
        assert!(max_per_ms.unwrap() <= 4096, "at most 4096 per ms, got {max_per_ms:?}");
        assert_eq!(dup_seqs, Some(0), "no sequence number repeats within a millisecond");
    }

    #[pg_test]
    fn the_view_shows_marks_and_space_left() {
        one_i64("SELECT next_scoped_id('t-view', 'd')");
        one_i64("SELECT first_id FROM reserve_block('t-view', 10)");
        let (mark, left) = Spi::get_two::<i64, i64>(
            "SELECT mark, remaining FROM pgticket.marks WHERE kind = 'scoped_id' AND queue = 't-view' AND domain = 'd'",
        )
        .unwrap();
        assert_eq!((mark, left), (Some(1), Some(i64::MAX - 1)));
        let (mark, left) =
            Spi::get_two::<i64, i64>("SELECT mark, remaining FROM pgticket.marks WHERE kind = 'block' AND block_name = 't-view'").unwrap();
        assert_eq!((mark, left), (Some(10), Some(i64::MAX - 10)));
    }

    #[pg_test]
    fn state_tables_are_dumped_with_the_extension() {
        let n = one_i64(
            "SELECT count(*) FROM pg_extension e, unnest(e.extconfig) c
              WHERE e.extname = 'pg_ticket' AND c IN ('pgticket.scoped_counters'::regclass, 'pgticket.blocks'::regclass)",
        );
        assert_eq!(n, 2);
    }

    #[pg_test]
    fn ordinary_roles_allocate_only_through_the_functions() {
        Spi::run("CREATE ROLE t_app NOLOGIN; GRANT USAGE ON SCHEMA tests TO t_app; SET LOCAL ROLE t_app").unwrap();
        assert_eq!(one_i64("SELECT next_scoped_id('t-priv', 'd')"), 1, "allocation works for any role");
        assert_eq!(one_i64("SELECT first_id FROM reserve_block('t-priv', 2)"), 1);
        assert_eq!(one_i64("SELECT mark FROM pgticket.marks WHERE queue = 't-priv'"), 1, "the view is readable");
        for stmt in [
            "INSERT INTO pgticket.scoped_counters VALUES ('t-priv', 'x', 5)",
            "UPDATE pgticket.scoped_counters SET mark = 0",
            "DELETE FROM pgticket.blocks",
            "SELECT * FROM pgticket.scoped_counters",
            "SELECT pgticket.advance_scoped_id('t-priv', 'd', 1000)",
            "SELECT pgticket.advance_block('t-priv', 1000)",
        ] {
            assert_eq!(sqlstate_of(stmt).as_deref(), Some("42501"), "{stmt}");
        }
        Spi::run("RESET ROLE").unwrap();
        assert_eq!(one_i64("SELECT next_scoped_id('t-priv', 'd')"), 2, "nothing the role tried moved the mark");
    }

    #[pg_test]
    fn a_hostile_search_path_changes_nothing() {
        Spi::run(
            "CREATE SCHEMA t_evil;
             CREATE TABLE t_evil.scoped_counters (queue text, domain text, mark bigint);
             CREATE FUNCTION t_evil.always_true(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
             CREATE OPERATOR t_evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = t_evil.always_true);
             CREATE FUNCTION t_evil.plus(bigint, bigint) RETURNS bigint LANGUAGE sql AS 'SELECT 1000';
             CREATE OPERATOR t_evil.+ (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = t_evil.plus);
             SET LOCAL search_path = t_evil, pg_catalog, public",
        )
        .unwrap();
        assert_eq!(one_i64("SELECT public.next_scoped_id('t-hijack', 'a')"), 1);
        assert_eq!(one_i64("SELECT public.next_scoped_id('t-hijack', 'b')"), 1);
        assert_eq!(one_i64("SELECT public.next_scoped_id('t-hijack', 'a')"), 2);
        assert_eq!(one_i64("SELECT count(*) FROM t_evil.scoped_counters"), 0);
    }

    #[pg_test]
    fn no_function_runs_with_owner_rights_and_an_open_search_path() {
        let n = one_i64(
            "SELECT count(*) FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
              WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_ticket')
                AND p.prosecdef AND NOT coalesce(p.proconfig::text LIKE '%search_path%', false)",
        );
        assert_eq!(n, 0);
        let public_can = Spi::get_one::<bool>(
            "SELECT bool_or(a.grantee = 0) FROM pg_proc p, aclexplode(p.proacl) a
              WHERE p.proname IN ('advance_scoped_id', 'advance_block') AND a.privilege_type = 'EXECUTE'",
        )
        .unwrap();
        assert_eq!(public_can, Some(false), "admin functions are not executable by PUBLIC");
    }
}
