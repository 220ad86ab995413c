//! `gpuloop doc`: the reference of every registered function, from the engine's own metadata,
//! and of the stdlib modules, from their doc comments.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    functions: Vec<FnMeta>,
}

#[derive(Debug, Deserialize, Clone)]
#[serde(rename_all = "camelCase")]
pub struct FnMeta {
    pub name: String,
    #[serde(default)]
    pub params: Vec<Param>,
    #[serde(default)]
    pub return_type: Option<String>,
    #[serde(default)]
    pub doc_comments: Vec<String>,
}

#[derive(Debug, Deserialize, Clone)]
pub struct Param {
    pub name: Option<String>,
    #[serde(rename = "type")]
    pub ty: Option<String>,
}

impl FnMeta {
    /// A script function's metadata: parameter names, no types (Rhai scripts have none).
    pub(crate) fn untyped(
        name: String,
        params: impl Iterator<Item = String>,
        doc_comments: Vec<String>,
    ) -> FnMeta {
        FnMeta {
            name,
            params: params
                .map(|p| Param {
                    name: Some(p),
                    ty: None,
                })
                .collect(),
            return_type: None,
            doc_comments,
        }
    }

    pub fn signature(&self) -> String {
        let params = self
            .params
            .iter()
            .map(|p| match (&p.name, &p.ty) {
                (Some(n), Some(t)) if n != "_" => format!("{n}: {t}"),
                (_, Some(t)) => t.clone(),
                (Some(n), None) => n.clone(),
                (None, None) => "?".into(),
            })
            .collect::<Vec<_>>()
            .join(", ");
        match self.return_type.as_deref() {
            Some(r) if !r.is_empty() && r != "()" => format!("{}({params}) -> {r}", self.name),
            _ => format!("{}({params})", self.name),
        }
    }

    /// The doc comment without the `///` leaders.
    pub fn doc(&self) -> String {
        self.doc_comments
            .iter()
            .flat_map(|c| c.lines())
            .map(|l| {
                l.trim_start_matches("///")
                    .trim_start_matches("/**")
                    .trim_end_matches("*/")
                    .trim()
            })
            .collect::<Vec<_>>()
            .join("\n")
            .trim()
            .to_string()
    }
}

/// Every gpuloop function the engine has (not rhai's standard library), sorted by name.
pub fn functions(engine: &rhai::Engine) -> Vec<FnMeta> {
    let json = engine.gen_fn_metadata_to_json(false).unwrap_or_default();
    let mut fns = serde_json::from_str::<Meta>(&json)
        .map(|m| m.functions)
        .unwrap_or_default();
    // Overloads with as many parameters come in hash order: the signature settles it.
    fns.sort_by_cached_key(|f| (f.name.clone(), f.params.len(), f.signature()));
    fns
}

/// The stdlib modules' functions: (module, [functions]).
pub fn stdlib_functions(engine: &rhai::Engine) -> Vec<(String, String, Vec<FnMeta>)> {
    let mut out = Vec::new();
    for (name, src) in super::modules::STDLIB {
        let header = src
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .map(|l| l.trim_start_matches("//!").trim())
            .collect::<Vec<_>>()
            .join(" ");
        let Ok(ast) = engine.compile(src) else {
            continue;
        };
        let mut fns: Vec<FnMeta> = ast
            .iter_functions()
            // Closures compile to `anon$…` functions; they are not part of the module's API.
            .filter(|f| {
                f.access != rhai::FnAccess::Private
                    && !f.name.starts_with('_')
                    && !f.name.starts_with("anon$")
            })
            .map(|f| {
                FnMeta::untyped(
                    format!("{name}::{}", f.name),
                    f.params.iter().map(|p| p.to_string()),
                    f.comments.iter().map(|c| c.to_string()).collect(),
                )
            })
            .collect();
        // The AST keeps functions in a hash map: sort, so the reference reads the same each time.
        fns.sort_by_cached_key(|f| (f.name.clone(), f.params.len(), f.signature()));
        out.push((name.to_string(), header, fns));
    }
    out
}

pub(crate) fn markdown(engine: &rhai::Engine) -> String {
    let mut out = String::from("# gpuloop script reference\n\nGenerated from the functions the engine registers (`gpuloop doc`).\n");
    let mut by_name: BTreeMap<String, Vec<FnMeta>> = BTreeMap::new();
    for f in functions(engine) {
        by_name.entry(f.name.clone()).or_default().push(f);
    }
    for (name, overloads) in by_name {
        // Property getters (`get$pid`) read as what scripts write: `job.pid`.
        if let Some(prop) = name.strip_prefix("get$") {
            for f in overloads {
                let this = f.params.first().and_then(|p| p.name.clone());
                let this = this.unwrap_or_else(|| "value".into());
                let ret = f.return_type.clone().unwrap_or_else(|| "?".into());
                out.push_str(&format!("\n## {this}.{prop}\n"));
                out.push_str(&format!("\n`{this}.{prop} -> {ret}`\n\n{}\n", f.doc()));
            }
            continue;
        }
        out.push_str(&format!("\n## {name}\n"));
        for f in overloads {
            out.push_str(&format!("\n`{}`\n\n{}\n", f.signature(), f.doc()));
        }
    }
    out.push_str("\n# Standard library modules\n\nImport with `import \"NAME\" as m;`.\n");
    for (module, header, fns) in stdlib_functions(engine) {
        out.push_str(&format!("\n## {module}\n\n{header}\n"));
        for f in fns {
            out.push_str(&format!("\n`{}`\n\n{}\n", f.signature(), f.doc()));
        }
    }
    out
}

/// Writes Rhai definition files for editors into `dir`: gpuloop's functions
/// (`__static__.d.rhai`), each stdlib module as imported under its own name
/// (`cleanup.d.rhai`: `cleanup::ensure_clean`), and the scripts' scope (`ARGS`).
pub(crate) fn write_definitions(engine: &rhai::Engine, dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let scope = super::engine::new_scope(&[], &[]);
    // Each file written as every file gpuloop writes is (`journal::files::replace`): never
    // through another account's link, never into a FIFO.
    let write = |name: &str, text: &str| {
        crate::journal::files::replace(&dir.join(name), text.as_bytes())
            .map_err(|e| format!("writing definitions: {e}"))
    };
    for (name, text) in engine
        .definitions_with_scope(&scope)
        .include_standard_packages(false)
        .iter_files()
    {
        write(&name, &text)?;
    }
    // The stdlib's functions are scripted: rhai's writer would give them no types and list
    // their closures, so they are written from their doc comments here.
    for (module, header, fns) in stdlib_functions(engine) {
        let mut text = format!("module {module};\n\n// {header}\n");
        for f in fns {
            let name = f.name.rsplit("::").next().unwrap_or(&f.name).to_string();
            let params: Vec<String> = f
                .params
                .iter()
                .map(|p| format!("{}: ?", p.name.as_deref().unwrap_or("_")))
                .collect();
            for line in f.doc().lines() {
                text.push_str(format!("\n/// {line}").trim_end());
            }
            text.push_str(&format!("\nfn {name}({}) -> ?;\n", params.join(", ")));
        }
        write(&format!("{module}.d.rhai"), &text)?;
    }
    Ok(())
}
