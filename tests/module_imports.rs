//! No two modules of the workspace import each other, parent and child included: a child takes
//! what it needs from the module that defines it (or a leaf below both), never from a parent that
//! re-exports it, so the import graph of every crate points one way. Read from the sources: every
//! `use` and every inline `crate::…` / `super::…` path outside comments and unit-test modules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module, as the path of names from its crate's root (empty: the root).
type Module = Vec<String>;

#[test]
fn no_two_modules_import_each_other() {
    // Registered by the `leasehold` crate; the workspace is two levels up.
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crates");
    let mut pairs = Vec::new();
    let mut crate_dirs: Vec<PathBuf> = std::fs::read_dir(&crates)
        .expect("read crates/")
        .map(|entry| entry.expect("crate dir").path())
        .collect();
    crate_dirs.sort();
    for dir in crate_dirs {
        let src = dir.join("src");
        if !src.is_dir() {
            continue;
        }
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let modules = modules_of(&src);
        let imports: BTreeMap<&Module, BTreeSet<Module>> = modules
            .iter()
            .map(|(module, text)| (module, imported_modules(&name, module, text, &modules)))
            .collect();
        for (a, of_a) in &imports {
            for b in of_a {
                if a < &b && imports.get(b).is_some_and(|of_b| of_b.contains(*a)) {
                    pairs.push(format!("{name}: {} <-> {}", show(a), show(b)));
                }
            }
        }
    }
    assert!(
        pairs.is_empty(),
        "modules that import each other (import the item from the module that defines it, or \
         move what both need into a leaf module):\n{}",
        pairs.join("\n")
    );
}

fn show(module: &Module) -> String {
    if module.is_empty() {
        "lib".to_owned()
    } else {
        module.join("::")
    }
}

/// Every module of the crate under `src`, with its source stripped of comments and of its
/// `#[cfg(test)] mod tests` (what tests import does not shape the crate).
fn modules_of(src: &Path) -> BTreeMap<Module, String> {
    let mut files = Vec::new();
    collect_rs(src, &mut files);
    files
        .into_iter()
        .map(|file| {
            let relative = file.strip_prefix(src).unwrap().with_extension("");
            let mut module: Module = relative
                .iter()
                .map(|part| part.to_string_lossy().into_owned())
                .collect();
            if matches!(
                module.last().map(String::as_str),
                Some("lib" | "main" | "mod")
            ) {
                module.pop();
            }
            let text = std::fs::read_to_string(&file).expect("read source");
            (module, code_of(&text))
        })
        .collect()
}

fn collect_rs(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read source dir") {
        let path = entry.expect("source entry").path();
        if path.is_dir() {
            collect_rs(&path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
}

/// The source without comment lines and without its unit-test module.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules of the crate that `module`'s code imports or names by path.
fn imported_modules(
    crate_name: &str,
    module: &Module,
    code: &str,
    modules: &BTreeMap<Module, String>,
) -> BTreeSet<Module> {
    let mut paths = Vec::new();
    for statement in use_statements(code) {
        paths.extend(expand(&statement));
    }
    paths.extend(inline_paths(code));
    paths
        .iter()
        .filter_map(|path| resolve(crate_name, module, path, modules))
        .filter(|target| target != module)
        .collect()
}

/// The trees of the `use` statements in `code` (`crate::a::{b, c::D}`), whitespace collapsed.
fn use_statements(code: &str) -> Vec<String> {
    let mut trees = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let starts_statement = rest[..at]
            .chars()
            .last()
            .is_none_or(|c| c.is_whitespace() || c == ';' || c == '{' || c == ')');
        let after = &rest[at + 4..];
        match (starts_statement, after.find(';')) {
            (true, Some(end)) => {
                trees.push(
                    after[..end]
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" "),
                );
                rest = &after[end..];
            }
            _ => rest = after,
        }
    }
    trees
}

/// A use tree as the paths it imports: `a::{b, c::{d, self}}` is `a::b`, `a::c::d`, `a::c`.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        // `a::B as C` imports `a::B`.
        let path = tree.split(" as ").next().unwrap_or(tree);
        return vec![path.replace(' ', "")];
    };
    let prefix = tree[..open].replace(' ', "");
    let Some(close) = tree.rfind('}').filter(|close| *close > open) else {
        return Vec::new(); // not a use tree (the words "use …" in a string)
    };
    let inner = &tree[open + 1..close];
    let (mut parts, mut depth, mut current) = (Vec::new(), 0, String::new());
    for c in inner.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        if c == ',' && depth == 0 {
            parts.push(std::mem::take(&mut current));
        } else {
            current.push(c);
        }
    }
    parts.push(current);
    parts
        .iter()
        .filter(|part| !part.trim().is_empty())
        .flat_map(|part| expand(part))
        .map(|path| {
            if path == "self" {
                prefix.trim_end_matches("::").to_owned()
            } else {
                format!("{prefix}{path}")
            }
        })
        .collect()
}

/// Paths written inline in code: `crate::a::b` and `super::c`, not part of a longer path.
fn inline_paths(code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    for root in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(root).map(|i| i + from) {
            let before = code[..at].chars().last();
            let inside_path = before.is_some_and(|c| c == ':' || c.is_alphanumeric() || c == '_');
            let end = code[at..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .map_or(code.len(), |i| i + at);
            if !inside_path {
                paths.push(code[at..end].trim_end_matches(':').to_owned());
            }
            from = end.max(at + root.len());
        }
    }
    paths
}

/// The module of the crate a path from `module` leads into (the longest module prefix), if any.
fn resolve(
    crate_name: &str,
    module: &Module,
    path: &str,
    modules: &BTreeMap<Module, String>,
) -> Option<Module> {
    let mut parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
    if parts.is_empty() {
        return None;
    }
    let mut base: Module = match parts[0] {
        "crate" => Vec::new(),
        "self" => module.clone(),
        "super" => {
            let mut base = module.clone();
            base.pop();
            base
        }
        // A path that starts with a child module's name (`use memory::MemoryStore;` in a parent).
        child if modules.contains_key(&[module.as_slice(), &[child.to_owned()]].concat()) => {
            parts.insert(0, "self");
            module.clone()
        }
        _ => return None,
    };
    let mut rest: Vec<&str> = parts.split_off(1);
    while rest.first() == Some(&"super") {
        base.pop();
        rest.remove(0);
    }
    // `leasehold::core` is the core crate re-exported under a name, not a module of this crate.
    if crate_name == "leasehold" && base.is_empty() && rest.first() == Some(&"core") {
        return None;
    }
    let mut found = modules.contains_key(&base).then(|| base.clone());
    for part in rest {
        base.push(part.to_owned());
        if modules.contains_key(&base) {
            found = Some(base.clone());
        } else {
            break;
        }
    }
    found
}
