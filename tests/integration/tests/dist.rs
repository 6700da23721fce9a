//! The PGXN distribution (`make dist`, #33 item 4): META.json follows the
//! PGXN meta spec v1 (validated by the `pgxn_meta` crate, which carries the
//! spec's JSON schemas), its version is Cargo's and the control file's, and
//! the zip holds one folder `pg_ticket-<version>/` with META.json, the
//! control file and every file META.json provides. Needs no server.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn cargo_version(root: &Path) -> String {
    let toml = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let line = toml.lines().find(|l| l.starts_with("version = ")).expect("a version in Cargo.toml");
    line.trim_start_matches("version = ").trim_matches('"').to_string()
}

fn meta(root: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(root.join("META.json")).unwrap()).expect("META.json is JSON")
}

#[test]
fn meta_json_follows_the_pgxn_spec_and_names_this_version() {
    let root = root();
    let meta = meta(&root);
    let dist = pgxn_meta::dist::Distribution::try_from(meta.clone()).unwrap_or_else(|e| panic!("META.json breaks the PGXN meta spec: {e}"));
    let version = cargo_version(&root);
    assert_eq!(dist.name(), "pg_ticket");
    assert_eq!(dist.version().to_string(), version, "META.json's version is Cargo.toml's");
    let provided = &meta["provides"]["pg_ticket"];
    assert_eq!(provided["version"], version.as_str(), "the extension META.json provides is this version");
    // pgrx writes Cargo's version into the installed control file.
    let control = std::fs::read_to_string(root.join("pg_ticket.control")).unwrap();
    let default_version = control
        .lines()
        .find_map(|l| l.strip_prefix("default_version = "))
        .expect("pg_ticket.control has a default_version")
        .trim_matches('\'');
    assert!(
        default_version == "@CARGO_VERSION@" || default_version == version,
        "pg_ticket.control's default_version {default_version} is neither Cargo's version nor filled from it"
    );
    assert_eq!(
        meta["prereqs"]["runtime"]["requires"]["PostgreSQL"], "15.0.0",
        "the oldest major tested is the one required"
    );
    for key in ["name", "abstract", "version", "maintainer", "license", "provides", "prereqs", "tags", "meta-spec"] {
        assert!(meta.get(key).is_some(), "META.json has {key}");
    }
    for (_, resource) in meta.get("resources").and_then(|r| r.as_object()).into_iter().flatten() {
        let urls = resource.as_str().map(|s| vec![s.to_string()]).unwrap_or_else(|| {
            resource.as_object().unwrap().iter().filter(|(k, _)| *k != "type").map(|(_, v)| v.as_str().unwrap().to_string()).collect()
        });
        assert!(urls.iter().all(|u| u.starts_with("https://")), "every resource is an address: {resource}");
    }
}

#[test]
fn make_dist_makes_the_zip_pgxn_takes() {
    let root = root();
    let status = Command::new(root.join("scripts/dist.sh")).status().expect("scripts/dist.sh runs");
    assert!(status.success(), "scripts/dist.sh failed");
    let version = cargo_version(&root);
    let zip = root.join(format!("target/dist/pg_ticket-{version}.zip"));
    let listing = Command::new("python3").args(["-c", "import sys, zipfile; print('\\n'.join(zipfile.ZipFile(sys.argv[1]).namelist()))"]).arg(&zip).output().unwrap();
    assert!(listing.status.success(), "{} is a zip: {}", zip.display(), String::from_utf8_lossy(&listing.stderr));
    let names: Vec<String> = String::from_utf8(listing.stdout).unwrap().lines().map(str::to_string).collect();
    let top = format!("pg_ticket-{version}/");
    assert!(names.iter().all(|n| n.starts_with(&top)), "every entry is under {top}");
    let meta = meta(&root);
    let provided = &meta["provides"]["pg_ticket"];
    let mut wanted = vec!["META.json".to_string(), "pg_ticket.control".to_string(), "Cargo.toml".to_string(), "Cargo.lock".to_string()];
    wanted.extend(["file", "docfile"].iter().filter_map(|k| provided[*k].as_str().map(str::to_string)));
    for file in wanted {
        assert!(names.contains(&format!("{top}{file}")), "the zip holds {file}");
    }
    assert!(!names.iter().any(|n| n.starts_with(&format!("{top}target/"))), "no build output in the zip");
}
