//! The parsed layer: rules that read the candidate's syntax tree (tree-sitter-python), not its text.
//!
//! The regex rules ([`super::rules`]) see `getattr(sys, "_get" + "frame")` as a `getattr` on `sys`
//! with a blanked string, `__import__("thre" + "ading")` as a call to `__import__`, and
//! `g = gc; g.get_objects()` as a method of some `g`. Here every expression that names something is
//! resolved to a dotted path: names through the file's imports and simple assignments (aliases),
//! attribute names and module names through constant folding ([`super::fold`]), and the dynamic
//! spellings (`getattr`, `__import__`, `importlib.import_module`, `sys.modules[...]`, `vars(m)`,
//! `m.__dict__[...]`, `object.__getattribute__`) through the name they reach. A path is then
//! classified: frames (`sys._getframe`, `inspect`, `f_back`, `f_locals`, `f_globals`, `tb_frame`,
//! `gi_frame`, ...), the garbage collector (`gc.get_objects/get_referrers/get_referents`),
//! `builtins`/`__builtins__`, `sys.modules`, a module's `__dict__`, `type.__setattr__`/
//! `object.__setattr__` and `setattr` on torch, `eval`/`exec`, an import or module attribute whose name
//! is computed at run time, and threads/processes/`ctypes` however they are reached. A constant string
//! that folds to one of these names is itself a finding, wherever it is used.
//!
//! Strict mode makes these findings errors (through the categories' levels); faithful mode keeps
//! KernelBench's rules and records these as warnings at most ([`super::StaticChecks`]).
//!
//! tree-sitter never fails on bad input: a syntax error becomes an `ERROR` node whose children are
//! still walked, so a hostile file cannot hide code from the walk by breaking the grammar.

use std::collections::{HashMap, HashSet};

use tree_sitter::{Node, Parser};

use super::config::Category;
use super::fold::Folder;
use super::rules::Hit;

/// Deepest name resolution followed (aliases of aliases, nested `getattr`).
const MAX_RESOLVE_DEPTH: u32 = 32;
/// Most paths one expression may resolve to.
const MAX_PATHS: usize = 8;

/// A computed attribute or module name (not a constant).
const COMPUTED: &str = "<computed>";
/// An object the layer cannot name (a call's result, a subscript, ...).
const UNKNOWN: &str = "<expr>";
/// The module an import with a computed name returns.
const COMPUTED_MODULE: &str = "<computed-module>";

/// Attributes that only frames, tracebacks, generators and functions have: reaching one reads the
/// harness's variables.
const FRAME_ATTRS: &[&str] = &[
    "f_back",
    "f_locals",
    "f_globals",
    "f_builtins",
    "tb_frame",
    "gi_frame",
    "cr_frame",
    "ag_frame",
    "__globals__",
    "__subclasses__",
    "_getframe",
    "_current_frames",
    "currentframe",
    "getouterframes",
    "getinnerframes",
    "get_objects",
    "get_referrers",
    "get_referents",
];

/// Modules (or path parts) that start threads or processes.
const THREAD_PARTS: &[&str] = &[
    "threading",
    "_thread",
    "multiprocessing",
    "concurrent",
    "subprocess",
];

/// `os` functions that start processes.
const OS_PROCESS: &[&str] = &[
    "fork",
    "forkpty",
    "system",
    "popen",
    "posix_spawn",
    "posix_spawnp",
    "spawnl",
    "spawnle",
    "spawnlp",
    "spawnlpe",
    "spawnv",
    "spawnve",
    "spawnvp",
    "spawnvpe",
    "execv",
    "execve",
    "execl",
    "execle",
    "execlp",
    "execvp",
];

/// Module roots on which a computed attribute name can reach anything above.
const SENSITIVE_ROOTS: &[&str] = &[
    "sys",
    "gc",
    "inspect",
    "builtins",
    "importlib",
    "os",
    "ctypes",
    "types",
    "torch",
    "time",
    "operator",
    "threading",
    "_thread",
    "multiprocessing",
];

/// Constant strings that name something the rules flag: a candidate has no honest use for a string
/// whose whole value is one of these.
const DANGER_STRINGS: &[(&str, Category)] = &[
    ("_getframe", Category::Introspection),
    ("_current_frames", Category::Introspection),
    ("currentframe", Category::Introspection),
    ("getouterframes", Category::Introspection),
    ("f_back", Category::Introspection),
    ("f_locals", Category::Introspection),
    ("f_globals", Category::Introspection),
    ("f_builtins", Category::Introspection),
    ("tb_frame", Category::Introspection),
    ("gi_frame", Category::Introspection),
    ("cr_frame", Category::Introspection),
    ("ag_frame", Category::Introspection),
    ("get_objects", Category::Introspection),
    ("get_referrers", Category::Introspection),
    ("get_referents", Category::Introspection),
    ("__builtins__", Category::Introspection),
    ("builtins", Category::Introspection),
    ("__globals__", Category::Introspection),
    ("__subclasses__", Category::Introspection),
    ("__dict__", Category::Introspection),
    ("__import__", Category::Introspection),
    ("import_module", Category::Introspection),
    ("settrace", Category::Introspection),
    ("setprofile", Category::Introspection),
    ("inspect", Category::Introspection),
    ("gc", Category::Introspection),
    ("sys", Category::Introspection),
    ("importlib", Category::Introspection),
    ("ctypes", Category::Introspection),
    ("modules", Category::Introspection),
    ("threading", Category::ThreadInjection),
    ("_thread", Category::ThreadInjection),
    ("multiprocessing", Category::ThreadInjection),
    ("concurrent", Category::ThreadInjection),
    ("concurrent.futures", Category::ThreadInjection),
    ("subprocess", Category::ThreadInjection),
    ("__setattr__", Category::TimingPatch),
    ("__delattr__", Category::TimingPatch),
    ("__code__", Category::TimingPatch),
];

/// The parsed layer's findings on `code` (offsets into `code`).
pub fn check(code: &str) -> Vec<Hit> {
    let mut parser = Parser::new();
    let tree = parser
        .set_language(&tree_sitter_python::LANGUAGE.into())
        .ok()
        .and_then(|()| parser.parse(code, None));
    let Some(tree) = tree else {
        // Only a cancelled or misconfigured parser returns nothing; strict mode must not pass what
        // it could not read.
        return vec![Hit {
            category: Category::Introspection,
            offset: None,
            message: "the Python parser could not read the file: strict mode refuses code its checks cannot read".into(),
        }];
    };
    let nodes = preorder(tree.root_node());
    let mut layer = Layer {
        folder: Folder::new(code.as_bytes()),
        aliases: HashMap::new(),
        modules: HashSet::new(),
        hits: Vec::new(),
    };
    for node in &nodes {
        layer.bind(*node);
    }
    for node in &nodes {
        layer.visit(*node);
    }
    layer.hits
}

/// Every node of the tree in source order, without recursion (a hostile file can nest deeply).
fn preorder(root: Node) -> Vec<Node> {
    let mut out = Vec::new();
    let mut cursor = root.walk();
    loop {
        out.push(cursor.node());
        if cursor.goto_first_child() {
            continue;
        }
        loop {
            if cursor.goto_next_sibling() {
                break;
            }
            if !cursor.goto_parent() {
                return out;
            }
        }
    }
}

struct Layer<'a> {
    folder: Folder<'a>,
    /// name -> the dotted paths it was bound to (imports, `x = module.attr`, `x = __import__(...)`).
    aliases: HashMap<String, Vec<String>>,
    /// Root names of imported modules (their `__dict__` is a module's).
    modules: HashSet<String>,
    hits: Vec<Hit>,
}

impl<'a> Layer<'a> {
    fn text(&self, node: Node) -> &'a str {
        self.folder.text(node)
    }

    fn alias(&mut self, name: &str, path: String) {
        let paths = self.aliases.entry(name.to_string()).or_default();
        if paths.len() < MAX_PATHS && !paths.contains(&path) {
            paths.push(path);
        }
    }

    /// First pass, in source order: imports, constant assignments and aliases.
    fn bind(&mut self, node: Node) {
        match node.kind() {
            "import_statement" => {
                let mut cursor = node.walk();
                for name in node.children_by_field_name("name", &mut cursor) {
                    let (path, local) = self.imported(name);
                    let root = path.split('.').next().unwrap_or_default().to_string();
                    match local {
                        Some(local) => {
                            self.modules.insert(local.clone());
                            self.alias(&local, path);
                        }
                        None => {
                            self.modules.insert(root.clone());
                        }
                    }
                    self.modules.insert(root);
                }
            }
            "import_from_statement" => {
                let Some(module) = node.child_by_field_name("module_name") else {
                    return;
                };
                let module = self.text(module).to_string();
                self.modules
                    .insert(module.split('.').next().unwrap_or_default().to_string());
                let mut cursor = node.walk();
                for name in node.children_by_field_name("name", &mut cursor) {
                    let (path, local) = self.imported(name);
                    let local = local.unwrap_or_else(|| path.clone());
                    self.alias(&local, format!("{module}.{path}"));
                }
            }
            "assignment" | "augmented_assignment" | "named_expression" => {
                let (left, right) = if node.kind() == "named_expression" {
                    (
                        node.child_by_field_name("name"),
                        node.child_by_field_name("value"),
                    )
                } else {
                    (
                        node.child_by_field_name("left"),
                        node.child_by_field_name("right"),
                    )
                };
                let (Some(left), Some(right)) = (left, right) else {
                    return;
                };
                if left.kind() != "identifier" {
                    return;
                }
                let name = self.text(left);
                self.folder
                    .bind(name, right, node.kind() == "augmented_assignment");
                if node.kind() != "augmented_assignment" {
                    // A computed path is flagged where it is computed; as an alias it would
                    // follow an unrelated local of the same name (`x`) through the file.
                    for path in self.resolve(right, 0) {
                        if !path.starts_with(UNKNOWN) && !path.contains(COMPUTED) && path != name {
                            self.alias(name, path);
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// `a.b` or `a.b as c` in an import: the dotted path and the local name, if aliased.
    fn imported(&self, name: Node) -> (String, Option<String>) {
        if name.kind() == "aliased_import" {
            let path = name
                .child_by_field_name("name")
                .map(|n| self.text(n).to_string())
                .unwrap_or_default();
            let local = name
                .child_by_field_name("alias")
                .map(|n| self.text(n).to_string());
            (path, local)
        } else {
            (self.text(name).to_string(), None)
        }
    }

    /// The dotted paths an expression names (several when a name was bound several times).
    fn resolve(&self, node: Node, depth: u32) -> Vec<String> {
        if depth > MAX_RESOLVE_DEPTH {
            return vec![UNKNOWN.into()];
        }
        let d = depth + 1;
        let mut out = match node.kind() {
            "parenthesized_expression" => match node.named_child(0) {
                Some(inner) => self.resolve(inner, d),
                None => vec![UNKNOWN.into()],
            },
            "identifier" => {
                let name = self.text(node);
                match self.aliases.get(name) {
                    Some(paths) => paths.clone(),
                    None if name == "__builtins__" => vec!["builtins".into()],
                    None => vec![name.to_string()],
                }
            }
            "attribute" => {
                let attr = node
                    .child_by_field_name("attribute")
                    .map(|a| self.text(a))
                    .unwrap_or_default();
                match node.child_by_field_name("object") {
                    Some(object) => self
                        .resolve(object, d)
                        .into_iter()
                        .map(|p| format!("{p}.{attr}"))
                        .collect(),
                    None => vec![UNKNOWN.into()],
                }
            }
            "call" => self.resolve_call(node, d),
            "subscript" => self.resolve_subscript(node, d),
            _ => vec![UNKNOWN.into()],
        };
        out.truncate(MAX_PATHS);
        out
    }

    /// The constant names an argument may fold to, or [`COMPUTED`].
    fn names(&self, node: Node) -> Vec<String> {
        let names = self.folder.strings(node);
        if names.is_empty() {
            vec![COMPUTED.into()]
        } else {
            names
        }
    }

    fn resolve_call(&self, node: Node, d: u32) -> Vec<String> {
        let (Some(function), Some(args)) = (
            node.child_by_field_name("function"),
            node.child_by_field_name("arguments"),
        ) else {
            return vec![UNKNOWN.into()];
        };
        let mut cursor = args.walk();
        let args: Vec<Node> = args
            .named_children(&mut cursor)
            .filter(|a| a.kind() != "keyword_argument")
            .collect();
        let mut out = Vec::new();
        for f in self.resolve(function, d) {
            match (f.as_str(), args.as_slice()) {
                (
                    "getattr"
                    | "builtins.getattr"
                    | "object.__getattribute__"
                    | "type.__getattribute__"
                    | "inspect.getattr_static",
                    [object, name, ..],
                ) => {
                    for o in self.resolve(*object, d) {
                        for n in self.names(*name) {
                            out.push(format!("{o}.{n}"));
                        }
                    }
                }
                (
                    "__import__"
                    | "builtins.__import__"
                    | "importlib.import_module"
                    | "importlib.__import__",
                    [name, ..],
                ) => {
                    for n in self.folder.strings(*name) {
                        out.push(n);
                    }
                    if out.is_empty() {
                        out.push(COMPUTED_MODULE.into());
                    }
                }
                ("vars" | "builtins.vars", [object]) => {
                    for o in self.resolve(*object, d) {
                        out.push(format!("{o}.__dict__"));
                    }
                }
                (path, [key, ..])
                    if path == "sys.modules.get" || path.ends_with(".__dict__.get") =>
                {
                    let prefix = path.trim_end_matches(".get").trim_end_matches(".__dict__");
                    for n in self.names(*key) {
                        out.push(if prefix == "sys.modules" {
                            n
                        } else {
                            format!("{prefix}.{n}")
                        });
                    }
                }
                _ => {}
            }
        }
        if out.is_empty() {
            out.push(UNKNOWN.into());
        }
        out
    }

    fn resolve_subscript(&self, node: Node, d: u32) -> Vec<String> {
        let (Some(value), Some(key)) = (
            node.child_by_field_name("value"),
            node.child_by_field_name("subscript"),
        ) else {
            return vec![UNKNOWN.into()];
        };
        let mut out = Vec::new();
        for v in self.resolve(value, d) {
            if v == "sys.modules" {
                out.extend(self.names(key));
            } else if let Some(prefix) = v.strip_suffix(".__dict__") {
                out.extend(self.names(key).into_iter().map(|n| format!("{prefix}.{n}")));
            }
        }
        if out.is_empty() {
            out.push(UNKNOWN.into());
        }
        out
    }

    fn hit(&mut self, node: Node, category: Category, message: String) {
        self.hits.push(Hit {
            category,
            offset: Some(node.start_byte()),
            message,
        });
    }

    /// Second pass: classify what each node reaches.
    fn visit(&mut self, node: Node) {
        match node.kind() {
            "identifier" if self.standalone(node) => self.classify_node(node),
            "attribute" | "subscript" => self.classify_node(node),
            "call" => {
                self.classify_node(node);
                self.call_rules(node);
            }
            "import_statement" | "import_from_statement" => self.import_rules(node),
            _ => {}
        }
        if matches!(
            node.kind(),
            "string" | "concatenated_string" | "binary_operator" | "call" | "subscript"
        ) && !is_bare_statement(node)
        {
            self.string_rules(node);
        }
    }

    /// An identifier that is an expression of its own, not an attribute name, a parameter, a
    /// keyword or part of an import.
    fn standalone(&self, node: Node) -> bool {
        let Some(parent) = node.parent() else {
            return true;
        };
        match parent.kind() {
            "dotted_name"
            | "aliased_import"
            | "parameters"
            | "default_parameter"
            | "typed_parameter"
            | "typed_default_parameter"
            | "function_definition"
            | "class_definition"
            | "lambda_parameters"
            | "global_statement"
            | "nonlocal_statement" => false,
            "attribute" => parent.child_by_field_name("attribute") != Some(node),
            "keyword_argument" => parent.child_by_field_name("name") != Some(node),
            _ => true,
        }
    }

    fn classify_node(&mut self, node: Node) {
        for path in self.resolve(node, 0) {
            if let Some((category, message)) = self.classify(&path) {
                self.hit(node, category, message);
            }
        }
    }

    /// What reaching `path` does, if it is something the rules flag.
    fn classify(&self, path: &str) -> Option<(Category, String)> {
        let parts: Vec<&str> = path.split('.').collect();
        let root = parts[0];
        let shown = path.replace(UNKNOWN, "(...)");
        if path == COMPUTED_MODULE {
            return Some((
                Category::Introspection,
                "imports a module whose name is computed at run time: the checks cannot see what it reaches".into(),
            ));
        }
        if parts.iter().any(|p| THREAD_PARTS.contains(p))
            || (root == "os" && parts.get(1).is_some_and(|p| OS_PROCESS.contains(p)))
        {
            return Some((
                Category::ThreadInjection,
                format!(
                    "reaches `{shown}`: work in another thread or process can finish after the timer stops"
                ),
            ));
        }
        if parts.contains(&"ctypes") {
            return Some((
                Category::Introspection,
                format!(
                    "reaches `{shown}`: raw memory access can read or write the harness's state"
                ),
            ));
        }
        let frames = root == "inspect"
            || (root == "sys"
                && parts
                    .get(1)
                    .is_some_and(|p| matches!(*p, "settrace" | "setprofile" | "monitoring")))
            || parts.iter().any(|p| FRAME_ATTRS.contains(p));
        if frames {
            return Some((
                Category::Introspection,
                format!(
                    "reaches `{shown}`: frame or garbage-collector access can read the harness's variables and the reference's output"
                ),
            ));
        }
        if root == "builtins" || (root == "sys" && parts.get(1) == Some(&"modules")) {
            return Some((
                Category::Introspection,
                format!(
                    "reaches `{shown}`: the interpreter's shared module and builtin tables can patch what the harness calls"
                ),
            ));
        }
        if let Some(at) = parts.iter().position(|p| *p == "__dict__")
            && at >= 1
            && self.modules.contains(root)
        {
            return Some((
                Category::Introspection,
                format!(
                    "reaches `{}`: a module's namespace dictionary can patch what the harness calls",
                    parts[..=at].join(".")
                ),
            ));
        }
        if let Some(at) = parts
            .iter()
            .position(|p| matches!(*p, "__setattr__" | "__delattr__"))
            && at >= 1
            && (matches!(root, "type" | "object") || self.modules.contains(root))
        {
            return Some((
                Category::TimingPatch,
                format!(
                    "calls `{}`: setting attributes past Python's checks can patch torch or the timer",
                    parts[..=at].join(".")
                ),
            ));
        }
        if parts.contains(&COMPUTED)
            && SENSITIVE_ROOTS.contains(&root)
            && self.modules.contains(root)
            || parts.contains(&COMPUTED) && matches!(root, "builtins")
        {
            return Some((
                Category::Introspection,
                format!(
                    "reaches `{shown}` with an attribute name computed at run time: the checks cannot see what it reaches"
                ),
            ));
        }
        None
    }

    fn call_rules(&mut self, node: Node) {
        let Some(function) = node.child_by_field_name("function") else {
            return;
        };
        let args: Vec<Node> = match node.child_by_field_name("arguments") {
            Some(a) => {
                let mut cursor = a.walk();
                a.named_children(&mut cursor).collect()
            }
            None => Vec::new(),
        };
        for f in self.resolve(function, 0) {
            match f.as_str() {
                "eval" | "exec" | "compile" | "builtins.eval" | "builtins.exec"
                | "builtins.compile" => {
                    self.hit(
                        node,
                        Category::Introspection,
                        format!("calls `{f}`: code built from a string at run time is code the checks cannot read"),
                    );
                }
                "setattr" | "delattr" | "builtins.setattr" | "builtins.delattr" => {
                    let Some(object) = args.first() else { continue };
                    for o in self.resolve(*object, 0) {
                        let root = o.split('.').next().unwrap_or_default();
                        if root == "torch" || (self.modules.contains(root) && root != "self") {
                            self.hit(
                                node,
                                Category::TimingPatch,
                                format!("`{f}` on `{o}`: patching torch or an imported module can fake the measured time or the check"),
                            );
                        }
                    }
                }
                _ => {}
            }
        }
    }

    fn import_rules(&mut self, node: Node) {
        let mut paths = Vec::new();
        if node.kind() == "import_statement" {
            let mut cursor = node.walk();
            for name in node.children_by_field_name("name", &mut cursor) {
                paths.push(self.imported(name).0);
            }
        } else if let Some(module) = node.child_by_field_name("module_name") {
            let module = self.text(module).to_string();
            paths.push(module.clone());
            let mut cursor = node.walk();
            for name in node.children_by_field_name("name", &mut cursor) {
                paths.push(format!("{module}.{}", self.imported(name).0));
            }
        }
        for path in paths {
            if let Some((category, message)) = self.classify(&path) {
                self.hit(node, category, message);
            }
        }
    }

    fn string_rules(&mut self, node: Node) {
        let Some(value) = self.folder.fold(node) else {
            return;
        };
        let Some(s) = value.as_str() else { return };
        if let Some((name, category)) = DANGER_STRINGS.iter().find(|(n, _)| *n == s) {
            self.hit(
                node,
                *category,
                format!("builds the name `{name}` as a string: a name spelled as data reaches what the rules forbid in code"),
            );
        }
    }
}

/// A string that is a statement of its own (a docstring).
fn is_bare_statement(node: Node) -> bool {
    node.parent()
        .is_some_and(|p| p.kind() == "expression_statement" && p.named_child_count() == 1)
}

#[cfg(test)]
mod tests;
