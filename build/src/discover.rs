//! Finding toolkits from build scripts.

use std::path::{Path, PathBuf};

/// Reads an environment variable from a build script and asks cargo to re-run the script when it
/// changes. Empty values count as unset.
pub fn env_var(name: &str) -> Option<String> {
    println!("cargo:rerun-if-env-changed={name}");
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// A directory named by an environment variable, if it is set and exists.
pub fn env_dir(name: &str) -> Option<PathBuf> {
    env_var(name).map(PathBuf::from).filter(|p| p.is_dir())
}

/// The first candidate for which `holds` is true.
pub fn first_matching<I, P>(candidates: I, holds: impl Fn(&Path) -> bool) -> Option<PathBuf>
where
    I: IntoIterator<Item = P>,
    P: Into<PathBuf>,
{
    candidates.into_iter().map(Into::into).find(|p| holds(p))
}

/// The `.venv` folders in `start` and its ancestors, nearest first: where `.ci/run` installs
/// vendor runtimes from PyPI.
pub fn venvs_above(start: &Path) -> Vec<PathBuf> {
    start
        .ancestors()
        .map(|d| d.join(".venv"))
        .filter(|v| v.is_dir())
        .collect()
}

/// The `site-packages` folders of a virtual environment (`lib/python3.*/site-packages`).
pub fn site_packages(venv: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(venv.join("lib")) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .map(|e| e.path().join("site-packages"))
        .filter(|p| p.is_dir())
        .collect();
    found.sort();
    found
}

/// Prints a multi-line explanation as cargo warnings, one per line, so it shows in the build
/// output of a user who lacks a toolkit.
pub fn warn(message: &str) {
    for line in message.lines() {
        println!("cargo:warning={line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn venvs_and_site_packages_are_found_nearest_first() {
        let root =
            std::env::temp_dir().join(format!("tessera-toolchain-test-{}", std::process::id()));
        let inner = root.join("a/b");
        let sp = root.join(".venv/lib/python3.11/site-packages");
        std::fs::create_dir_all(&inner).unwrap();
        std::fs::create_dir_all(&sp).unwrap();
        std::fs::create_dir_all(inner.join(".venv")).unwrap();
        let found = venvs_above(&inner);
        assert_eq!(found[0], inner.join(".venv"));
        assert!(found.contains(&root.join(".venv")));
        assert_eq!(site_packages(&root.join(".venv")), vec![sp]);
        assert!(site_packages(&inner.join(".venv")).is_empty());
        assert_eq!(
            first_matching([root.join("missing"), root.clone()], |p| p.is_dir()),
            Some(root.clone())
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
