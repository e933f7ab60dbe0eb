//! CONTRIBUTING.md's Prerequisites name everything the test command needs
//! (the README's test command links there): every Debian package that a
//! test's failure message tells the reader to install is on its
//! Debian/Ubuntu install line. (A newcomer once followed the README,
//! installed `redis-server` alone, and two fault tests failed asking for
//! `faketime`, which only the Fencing section named.)

use std::collections::BTreeSet;
use std::path::Path;

fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace root")
}

/// The packages after `apt-get install -y` on one line (flags skipped).
fn packages_of(line: &str) -> impl Iterator<Item = String> + '_ {
    line.split("apt-get install")
        .skip(1)
        .flat_map(|rest| {
            rest.split(['`', '"', '#', ')'])
                .next()
                .unwrap_or("")
                .split_whitespace()
                .filter(|w| !w.starts_with('-'))
                .map(|w| w.trim_end_matches(['.', ',', ':', '\\']).to_owned())
                .collect::<Vec<_>>()
        })
        .filter(|p| !p.is_empty())
}

/// Every package a test's install hint names, in the harness and the tests.
fn hinted_packages() -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut dirs = vec![
        workspace_root().join("tests/src"),
        workspace_root().join("tests/tests"),
    ];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read a test source folder") {
            let path = entry.expect("a folder entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs")
                && path.file_name().is_some_and(|n| n != "prerequisite.rs")
            {
                let text = std::fs::read_to_string(&path).expect("read a test source file");
                for line in text.lines().filter(|l| l.contains("apt-get install -y")) {
                    found.extend(packages_of(line));
                }
            }
        }
    }
    found
}

/// The packages of the Debian/Ubuntu line in CONTRIBUTING.md's Prerequisites.
fn install_line_packages() -> BTreeSet<String> {
    let contributing = std::fs::read_to_string(workspace_root().join("CONTRIBUTING.md"))
        .expect("read CONTRIBUTING.md");
    let start = contributing
        .find("## Prerequisites")
        .expect("CONTRIBUTING.md has a Prerequisites section");
    let section = &contributing[start..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    let line = section
        .lines()
        .find(|l| l.contains("apt-get install") && l.contains("Debian"))
        .expect("the Prerequisites have a Debian/Ubuntu install line");
    packages_of(line).collect()
}

#[test]
fn the_install_line_names_every_package_a_test_asks_for() {
    let hinted = hinted_packages();
    assert!(
        hinted.contains("redis-server") && hinted.contains("faketime"),
        "the scan found the harness's install hints: {hinted:?}"
    );
    let line = install_line_packages();
    let missing: Vec<_> = hinted.difference(&line).collect();
    assert!(
        missing.is_empty(),
        "CONTRIBUTING.md's Prerequisites install line lacks {missing:?} (it names {line:?})"
    );
}

#[test]
fn the_ci_installs_the_install_line() {
    let ci = std::fs::read_to_string(workspace_root().join(".ci/run")).expect("read .ci/run");
    let ci_packages: BTreeSet<String> = ci.lines().flat_map(packages_of).collect();
    let missing: Vec<_> = install_line_packages()
        .into_iter()
        .filter(|p| !ci_packages.contains(p))
        .collect();
    assert!(
        missing.is_empty(),
        ".ci/run does not install {missing:?} from CONTRIBUTING.md's install line"
    );
}
