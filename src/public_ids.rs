//! Public IDs (#50, docs/public-ids.md): `pgticket.public_id(id, key)` and
//! `pgticket.private_id(form, key)`, the keyed permutation of
//! `ticket_core::public_id` under a named key of `pgticket.public_keys`.
//! A key has versions: the newest live one encodes, every live one
//! decodes, each form naming its version's slot (at most 32 live at once).
//! A key is a secret: a role uses one only with a grant
//! (`pgticket.grant_public_key`, a row of `pgticket.rights` of kind
//! `public_key`), whatever `pg_ticket.scope_rights` says.
//!
//! Touches: `pgticket.public_keys` (read and written as its owner; its
//! `changed` trigger invalidates it, so a key made, retired or granted
//! reaches every session at its next call), the rights, the group's rule
//! for what is created on one node only (`group::check_may_create`).

use std::collections::HashMap;
use std::rc::Rc;

use pgrx::prelude::*;
use ticket_core::public_id::{slot_in, slot_of, PublicIdError, PublicKey, KEY_LEN, SLOTS};

use crate::args::{name_arg, required};
use crate::backend_local::BackendRefCell;
use crate::errors::{OrRaise, TicketError};
use crate::names::Name;
use crate::state_tables;

/// A key's live versions, oldest first, their AES key schedules made.
type Versions = Rc<Vec<(i64, PublicKey)>>;

/// Keys read in this backend, until the state tables' generation moves.
#[derive(Default)]
struct Cache {
    generation: u64,
    keys: HashMap<Vec<u8>, Versions>,
}

static CACHE: BackendRefCell<Cache> = BackendRefCell::new();
/// Keys kept at most; more are read again (a key is one row and an AES key
/// schedule per version).
const MAX_CACHED: usize = 256;

fn table() -> state_tables::Table {
    state_tables::lookup()
        .and_then(|t| t.public_keys)
        .unwrap_or_else(|| pgrx::error!("pg_ticket: pgticket.public_keys is missing; run ALTER EXTENSION pg_ticket UPDATE"))
}

/// The live versions of `name`, for a role granted it.
fn versions(name: Name<'_>) -> Versions {
    crate::rights::check_key(name).or_raise();
    let generation = state_tables::generation();
    let cached = CACHE.with(|c| {
        if c.generation != generation {
            c.keys.clear();
            c.generation = generation;
        }
        c.keys.get(name.bytes()).cloned()
    });
    if let Some(versions) = cached {
        return versions;
    }
    let rows = read_versions(name);
    let live: Vec<(i64, PublicKey)> = rows
        .iter()
        .filter(|(_, _, retired)| !retired)
        .map(|(version, key, _)| {
            let key = PublicKey::new(*version, key)
                .unwrap_or_else(|e| pgrx::error!("pg_ticket: version {version} of public key {} is damaged: {e}", name.quoted()));
            (*version, key)
        })
        .collect();
    if live.is_empty() {
        TicketError::NoPublicKey { name: name.display(), retired: !rows.is_empty() }.raise();
    }
    let versions = Rc::new(live);
    // Kept only if nothing changed while it was read.
    if state_tables::generation() == generation {
        CACHE.with(|c| {
            if c.keys.len() >= MAX_CACHED {
                c.keys.clear();
            }
            c.keys.insert(name.bytes().to_vec(), versions.clone());
        });
    }
    versions
}

/// Every version of key `name` (version, key, retired), oldest first, as
/// committed now: a self snapshot, not the transaction's (helper-12: under
/// REPEATABLE READ a session read the versions as its snapshot had them,
/// after the invalidation of a rotation or a retirement, and kept them for
/// good); no SPI, so no setting or rule of anyone takes part.
fn read_versions(name: Name<'_>) -> Vec<(i64, Vec<u8>, bool)> {
    const NAME: i32 = 1;
    const VERSION: i32 = 2;
    const KEY: i32 = 3;
    const RETIRED_AT: i32 = 5;
    let mut rows = Vec::new();
    state_tables::for_each_committed_row(table().oid, |tuple, desc| unsafe {
        let column = |n: i32| {
            let mut null = false;
            let datum = pg_sys::heap_getattr(tuple, n, desc, &mut null);
            (datum, null)
        };
        let (datum, null) = column(NAME);
        if Name::from_datum(datum, null).is_none_or(|n| n.bytes() != name.bytes()) {
            return;
        }
        let (version, null) = column(VERSION);
        let (key, key_null) = column(KEY);
        let (_, not_retired) = column(RETIRED_AT);
        if !null {
            let key: Option<Vec<u8>> = pgrx::FromDatum::from_datum(key, key_null);
            rows.push((i64::from(version.value() as i32), key.unwrap_or_default(), !not_retired));
        }
    });
    rows.sort_by_key(|(version, _, _)| *version);
    rows
}

/// The public form of `id` under the newest live version of key `key`.
#[pg_extern(stable, parallel_restricted, schema = "pgticket")]
fn public_id(id: i64, key: Name<'_>) -> String {
    crate::errors::postgres_errors_as_raised(|| {
        let versions = versions(name_arg("key", Some(key)));
        let (_, newest) = versions.last().expect("at least one live version");
        newest.encode(id)
    })
}

/// The ID whose public form under key `key` is `form` (the version its form
/// names); a mistyped form, or another key's, is refused (22P02).
#[pg_extern(stable, parallel_restricted, schema = "pgticket")]
fn private_id(form: Name<'_>, key: Name<'_>) -> i64 {
    crate::errors::postgres_errors_as_raised(|| {
        let versions = versions(name_arg("key", Some(key)));
        // The database's bytes: outside UTF-8 (a LATIN1 database's é) no
        // form either (helper-12: XX000 from a conversion to &str).
        let shown = || form.display().chars().take(40).collect::<String>();
        let Ok(form) = std::str::from_utf8(form.bytes()) else {
            TicketError::PublicId { form: shown(), error: PublicIdError::Character(char::REPLACEMENT_CHARACTER) }.raise()
        };
        let decoded = slot_in(form).and_then(|slot| {
            let (_, version) = versions.iter().find(|(v, _)| slot_of(*v).ok() == Some(slot)).ok_or(PublicIdError::Check)?;
            version.decode(form)
        });
        decoded.unwrap_or_else(|error| TicketError::PublicId { form: form.chars().take(40).collect(), error }.raise())
    })
}

/// Admin: a new version of key `name` (the first makes the key), 32 bytes
/// from the server's strong random source; it encodes from now on and the
/// older live versions go on decoding. Returns the version.
#[pg_extern(volatile, schema = "pgticket")]
fn create_public_key(name: Option<Name<'_>>) -> i32 {
    crate::errors::postgres_errors_as_raised(|| {
        let name = name_arg("name", name);
        // A grant's trailing * is a prefix: a key named so could not be
        // granted alone (helper-12: 'pay*' also covered payroll).
        if name.bytes().contains(&b'*') {
            TicketError::InvalidArgument(format!("public key {}: a key's name has no *, which a grant reads as a prefix", name.quoted())).raise();
        }
        crate::xact::check_writable().or_raise();
        // Two nodes of a group making one key's version would make two
        // keys under one name: made on the node that creates scopes.
        crate::group::check_may_create(&format!("public key {}", name.quoted())).or_raise();
        let mut key = [0u8; KEY_LEN];
        if !unsafe { pg_sys::pg_strong_random(key.as_mut_ptr().cast(), KEY_LEN) } {
            pgrx::error!("pg_ticket: the server's strong random source failed");
        }
        state_tables::as_owner_of(table(), || {
            Spi::connect_mut(|client| {
                client.update("LOCK TABLE pgticket.public_keys IN SHARE ROW EXCLUSIVE MODE", None, &[])?;
                // As committed now, after the lock: a REPEATABLE READ
                // snapshot missed a version made meanwhile (23505).
                let versions = read_versions(name);
                let version = versions.last().map_or(0, |(v, _, _)| *v) + 1;
                let same_slot = version - i64::from(SLOTS);
                let live_in_slot = versions.iter().any(|(v, _, retired)| !retired && *v <= same_slot);
                if live_in_slot {
                    TicketError::InvalidArgument(format!(
                        "public key {} has {SLOTS} live versions, the most whose forms can be told apart: retire version {same_slot} or an older one first (pgticket.retire_public_key)",
                        name.quoted()
                    ))
                    .raise();
                }
                if version > i64::from(i32::MAX) {
                    TicketError::InvalidArgument(format!("public key {} has no version left", name.quoted())).raise();
                }
                client.update(
                    "INSERT INTO pgticket.public_keys (name, version, key) VALUES ($1, $2, $3)",
                    None,
                    &[name.to_datum(), (version as i32).into(), key.to_vec().into()],
                )?;
                Ok::<_, pgrx::spi::Error>(version as i32)
            })
        })
        .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot write pgticket.public_keys: {e}"))
    })
}

/// Admin: version `version` of key `name` no longer decodes (nor encodes);
/// true if it was live.
#[pg_extern(volatile, schema = "pgticket")]
fn retire_public_key(name: Option<Name<'_>>, version: Option<i32>) -> bool {
    crate::errors::postgres_errors_as_raised(|| {
        let name = name_arg("name", name);
        let version = required("version", version);
        crate::xact::check_writable().or_raise();
        state_tables::as_owner_of(table(), || {
            Spi::connect_mut(|client| {
                let rows = client.update(
                    "UPDATE pgticket.public_keys SET retired_at = pg_catalog.now() \
                      WHERE name OPERATOR(pg_catalog.=) $1 AND version OPERATOR(pg_catalog.=) $2 AND retired_at IS NULL",
                    None,
                    &[name.to_datum(), version.into()],
                )?;
                Ok::<_, pgrx::spi::Error>(rows.len() > 0)
            })
        })
        .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot write pgticket.public_keys: {e}"))
    })
}

extension_sql!(
    r#"
-- 0.5.0 (#50): the keys of public IDs, each version 32 bytes from the
-- server's strong random source. Readable by the extension's owner only;
-- dumped (a restore keeps the forms readable): a dump holds the keys.
CREATE TABLE pgticket.public_keys (
    name text COLLATE "C" NOT NULL,
    version integer NOT NULL CHECK (version > 0),
    key bytea NOT NULL CHECK (pg_catalog.octet_length(key) OPERATOR(pg_catalog.=) 32),
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    retired_at timestamptz,
    PRIMARY KEY (name, version)
);
COMMENT ON TABLE pgticket.public_keys IS
    'The keys of public IDs (pgticket.public_id, pgticket.private_id): each version of each named key, its creation and retirement';
REVOKE ALL ON pgticket.public_keys FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('pgticket.public_keys', '');
CREATE FUNCTION pgticket.public_keys_changed() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'rights_changed_wrapper';
REVOKE ALL ON FUNCTION pgticket.public_keys_changed() FROM PUBLIC;
COMMENT ON FUNCTION pgticket.public_keys_changed() IS
    'Trigger: a change of pgticket.public_keys reaches every session';
CREATE TRIGGER changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON pgticket.public_keys
    FOR EACH STATEMENT EXECUTE FUNCTION pgticket.public_keys_changed();
ALTER TABLE pgticket.public_keys ENABLE ALWAYS TRIGGER changed;
-- Rows applied by logical replication fire row triggers only (a retirement
-- replicated from another node reached no session here).
CREATE TRIGGER changed_row AFTER INSERT OR UPDATE OR DELETE ON pgticket.public_keys
    FOR EACH ROW EXECUTE FUNCTION pgticket.public_keys_changed();
ALTER TABLE pgticket.public_keys ENABLE ALWAYS TRIGGER changed_row;
-- A dump restored into the database it came from: a key version there
-- already is skipped (the same secret).
CREATE TRIGGER keeps_present BEFORE INSERT ON pgticket.public_keys
    FOR EACH ROW EXECUTE FUNCTION pgticket.merge_loaded_row();
ALTER TABLE pgticket.public_keys ENABLE ALWAYS TRIGGER keeps_present;
ALTER TABLE pgticket.rights DROP CONSTRAINT rights_kind_check;
ALTER TABLE pgticket.rights ADD CONSTRAINT rights_kind_check CHECK (kind IN ('scope', 'block', 'public_key'));
CREATE OR REPLACE VIEW pgticket.scope_grants AS
    SELECT role, kind,
           CASE WHEN kind OPERATOR(pg_catalog.=) 'scope' THEN queue END AS queue,
           CASE WHEN kind OPERATOR(pg_catalog.=) 'scope' THEN domain END AS domain,
           CASE WHEN kind OPERATOR(pg_catalog.=) 'block' THEN queue END AS block_name,
           CASE WHEN kind OPERATOR(pg_catalog.=) 'public_key' THEN queue END AS public_key
      FROM pgticket.rights;
CREATE FUNCTION pgticket.grant_public_key(role regrole, name text) RETURNS boolean
VOLATILE SECURITY DEFINER LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$ SELECT pgticket.change_right(true, role, 'public_key', name, NULL) $$;
CREATE FUNCTION pgticket.revoke_public_key(role regrole, name text) RETURNS boolean
VOLATILE SECURITY DEFINER LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$ SELECT pgticket.change_right(false, role, 'public_key', name, NULL) $$;
COMMENT ON FUNCTION pgticket.grant_public_key(regrole, text) IS
    'Lets role encode and decode public IDs with key name (a trailing * is a prefix); true if new';
COMMENT ON FUNCTION pgticket.revoke_public_key(regrole, text) IS
    'Removes the grant pgticket.grant_public_key(role, name) made; true if there was one';
REVOKE EXECUTE ON FUNCTION pgticket.grant_public_key(regrole, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.revoke_public_key(regrole, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.create_public_key(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.retire_public_key(text, integer) FROM PUBLIC;
COMMENT ON FUNCTION pgticket.public_id(bigint, text) IS
    'The public form of id under key (15 characters, Crockford base 32): a keyed permutation (FF1 over AES-256), reversible only with the key';
COMMENT ON FUNCTION pgticket.private_id(text, text) IS
    'The id whose public form under key is form; a mistyped form or another key''s is refused (22P02)';
COMMENT ON FUNCTION pgticket.create_public_key(text) IS
    'Admin: a new version of public key name (the first makes it), from the server''s strong random source; it encodes from now on, older live versions still decode; the version';
COMMENT ON FUNCTION pgticket.retire_public_key(text, integer) IS
    'Admin: that version of public key name no longer decodes; true if it was live';
"#,
    name = "public_ids",
    requires = ["rights", public_id, private_id, create_public_key, retire_public_key, "schema"]
);
