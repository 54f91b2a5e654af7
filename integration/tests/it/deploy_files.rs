//! The deployment files under `deploy/`: the Kubernetes manifests against the
//! API's schemas (`kubernetes-validate --strict`) and against each other and
//! the real binaries (ports, probes, selectors), every flag and
//! `CRESCENT_*` variable they (and `deploy/docker-compose.yml`, when present)
//! hand to `crescent-master`/`crescent-store` (against each binary's `--help`),
//! and every metric the Grafana dashboard queries (against a live master's and
//! store's `/metrics`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use crescent_integration::{find_binary, http_request, LocalCluster};
use serde_yaml::Value;

const MASTER: &str = "crescent-master";
const STORE: &str = "crescent-store";
const BINARIES: [&str; 3] = [MASTER, STORE, "crescentctl"];

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

// ---------------------------------------------------------------------------
// --help of the real binaries
// ---------------------------------------------------------------------------

/// What a binary's `--help` accepts.
struct Help {
    binary: String,
    /// Long flags, `--node-id`.
    flags: BTreeSet<String>,
    /// Environment variables named by `[env: NAME=]`.
    envs: BTreeSet<String>,
    /// Flag -> its (last) `[default: ...]` value.
    defaults: BTreeMap<String, String>,
}

impl Help {
    fn of(binary: &str) -> Help {
        let path = find_binary(binary).unwrap_or_else(|e| panic!("{e}"));
        let out = Command::new(&path)
            .arg("--help")
            .output()
            .unwrap_or_else(|e| panic!("cannot run {} --help: {e}", path.display()));
        assert!(out.status.success(), "{binary} --help failed");
        Help::parse(binary, &String::from_utf8_lossy(&out.stdout))
    }

    /// clap's `--help` layout: an option line (`      --listen <LISTEN>`, or
    /// `  -h, --help`), then its description with `[env: ...]` and `[default: ...]`.
    fn parse(binary: &str, text: &str) -> Help {
        let mut flags = BTreeSet::new();
        let mut envs = BTreeSet::new();
        let mut descriptions: BTreeMap<String, String> = BTreeMap::new();
        let mut current: Option<String> = None;
        for line in text.lines() {
            let trimmed = line.trim_start();
            if trimmed.starts_with('-') && line.starts_with(' ') {
                let names = long_flags(trimmed);
                flags.extend(names.iter().cloned());
                current = names.last().cloned();
                continue;
            }
            if let Some(flag) = &current {
                let d = descriptions.entry(flag.clone()).or_default();
                d.push(' ');
                d.push_str(trimmed);
            }
        }
        let mut defaults = BTreeMap::new();
        for (flag, d) in &descriptions {
            let mut rest = d.as_str();
            while let Some(i) = rest.find("[env: ") {
                rest = &rest[i + 6..];
                let end = rest.find(['=', ']']).unwrap_or(rest.len());
                envs.insert(rest[..end].to_string());
            }
            if let Some(i) = d.rfind("[default: ") {
                let v = &d[i + 10..];
                let v = &v[..v.find(']').unwrap_or(v.len())];
                defaults.insert(flag.clone(), v.to_string());
            }
        }
        assert!(
            flags.contains("--help") && !envs.is_empty(),
            "could not parse {binary} --help:\n{text}"
        );
        Help {
            binary: binary.to_string(),
            flags,
            envs,
            defaults,
        }
    }

    /// The port of a `host:port` default, e.g. `--listen` -> 50051.
    fn default_port(&self, flag: &str) -> u64 {
        let d = self
            .defaults
            .get(flag)
            .unwrap_or_else(|| panic!("{} --help shows no default for {flag}", self.binary));
        port_of(d).unwrap_or_else(|| panic!("{} {flag} default {d:?} has no port", self.binary))
    }
}

fn port_of(addr: &str) -> Option<u64> {
    addr.trim_matches('"').rsplit_once(':')?.1.parse().ok()
}

/// `--long-flag` tokens in a command line or shell script.
fn long_flags(text: &str) -> Vec<String> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i + 2 < b.len() {
        let boundary = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b"-_.$".contains(&b[i - 1]));
        if boundary && b[i] == b'-' && b[i + 1] == b'-' && b[i + 2].is_ascii_lowercase() {
            let mut j = i + 2;
            while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'-') {
                j += 1;
            }
            out.push(text[i..j].to_string());
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

/// Splits a command line or script into words the way a shell would for
/// simple cases: quotes group and are removed, `\` + newline continues.
fn shell_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    let mut chars = text.chars().peekable();
    while let Some(ch) = chars.next() {
        match (quote, ch) {
            (Some(q), _) if ch == q => quote = None,
            (Some(_), _) => word.get_or_insert_with(String::new).push(ch),
            (None, '"' | '\'') => {
                quote = Some(ch);
                word.get_or_insert_with(String::new);
            }
            (None, '\\') if chars.peek() == Some(&'\n') => {
                chars.next();
            }
            (None, _) if ch.is_whitespace() => words.extend(word.take()),
            (None, _) => word.get_or_insert_with(String::new).push(ch),
        }
    }
    words.extend(word);
    words
}

/// The values given to `flag` (`--flag value` or `--flag=value`), unquoted.
fn flag_values(text: &str, flag: &str) -> Vec<String> {
    let words = shell_words(text);
    let mut out = Vec::new();
    for (i, w) in words.iter().enumerate() {
        if let Some(v) = w.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            out.push(v.to_string());
        } else if w == flag {
            out.extend(words.get(i + 1).cloned());
        }
    }
    out
}

/// Which of our binaries a command line runs: the program of the first simple
/// command (after `exec` and variable assignments, and inside `sh -c`
/// scripts) that is one of them.
fn program_of(text: &str) -> Option<&'static str> {
    let text = text.replace("\\\n", " ");
    for cmd in text.split(['\n', ';', '&', '|']) {
        let words = shell_words(cmd);
        let mut rest = words
            .iter()
            .map(String::as_str)
            .skip_while(|w| *w == "exec" || (w.contains('=') && !w.starts_with('-')));
        let Some(first) = rest.next() else {
            continue;
        };
        let base = first.rsplit('/').next().unwrap_or(first);
        if matches!(base, "sh" | "bash" | "dash") {
            let args: Vec<&str> = rest.collect();
            if args.first() == Some(&"-c") {
                if let Some(p) = program_of(&args[1..].join(" ")) {
                    return Some(p);
                }
            }
            continue;
        }
        if let Some(b) = BINARIES.iter().copied().find(|b| *b == base) {
            return Some(b);
        }
    }
    None
}

/// Names referenced as kubelet `$(NAME)` and shell `${NAME...}` expansions.
fn referenced_vars(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for open in ["$(", "${"] {
        let mut rest = text;
        while let Some(i) = rest.find(open) {
            rest = &rest[i + 2..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // `$((` is shell arithmetic, not a variable.
            if !name.is_empty() && !name.starts_with(|c: char| c.is_ascii_digit()) {
                out.insert(name);
            }
        }
    }
    out
}

fn is_our_env(name: &str) -> bool {
    name.starts_with("CRESCENT_") || name.starts_with("MOONCAKE_")
}

// ---------------------------------------------------------------------------
// Kubernetes manifests
// ---------------------------------------------------------------------------

struct Doc {
    file: String,
    v: Value,
}

impl Doc {
    fn kind(&self) -> &str {
        s(&self.v["kind"])
    }
    fn name(&self) -> &str {
        s(&self.v["metadata"]["name"])
    }
    fn what(&self) -> String {
        format!("{} {} ({})", self.kind(), self.name(), self.file)
    }
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

fn seq(v: &Value) -> &[Value] {
    v.as_sequence().map(Vec::as_slice).unwrap_or(&[])
}

/// Splits a multi-document YAML stream at its `---` lines.
fn yaml_documents(text: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for line in text.lines() {
        if line == "---" || line.starts_with("--- ") {
            docs.push(String::new());
        } else {
            let d = docs.last_mut().expect("never empty");
            d.push_str(line);
            d.push('\n');
        }
    }
    docs
}

/// The manifest files under `deploy/kubernetes`, sorted.
fn manifest_files() -> Vec<PathBuf> {
    let dir = deploy_dir().join("kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in {}", dir.display());
    files
}

fn manifests() -> Vec<Doc> {
    let files = manifest_files();
    let mut docs = Vec::new();
    for f in files {
        let file = f.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&f).unwrap();
        for (n, part) in yaml_documents(&text).into_iter().enumerate() {
            let v: Value = serde_yaml::from_str(&part)
                .unwrap_or_else(|e| panic!("{file} document {n} is not valid YAML: {e}"));
            if v.is_null() {
                continue;
            }
            docs.push(Doc {
                file: file.clone(),
                v,
            });
        }
    }
    docs
}

fn find<'a>(docs: &'a [Doc], kind: &str, name: &str) -> &'a Doc {
    docs.iter()
        .find(|d| d.kind() == kind && d.name() == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in deploy/kubernetes"))
}

/// `selector` (a label map) matches `labels`: every pair is present.
fn selects(selector: &Value, labels: &Value) -> bool {
    let Some(sel) = selector.as_mapping() else {
        return false;
    };
    !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn pod_template(d: &Doc) -> &Value {
    &d.v["spec"]["template"]
}

fn containers(d: &Doc) -> &[Value] {
    seq(&pod_template(d)["spec"]["containers"])
}

fn command_text(c: &Value) -> String {
    seq(&c["command"])
        .iter()
        .chain(seq(&c["args"]))
        .map(|v| s(v).to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A container port by name or number.
fn resolve_port(c: &Value, port: &Value) -> Option<u64> {
    if let Some(n) = port.as_u64() {
        return Some(n);
    }
    seq(&c["ports"])
        .iter()
        .find(|p| s(&p["name"]) == s(port))
        .and_then(|p| p["containerPort"].as_u64())
}

fn named_port(d: &Doc, c: &Value, name: &str) -> u64 {
    resolve_port(c, &Value::String(name.into())).unwrap_or_else(|| {
        panic!(
            "{}: container {} has no port named {name}",
            d.what(),
            s(&c["name"])
        )
    })
}

/// The single container of a workload, and the binary it runs.
fn workload_container<'a>(d: &'a Doc, binary: &str) -> &'a Value {
    let cs = containers(d);
    let c = cs
        .iter()
        .find(|c| program_of(&command_text(c)) == Some(binary))
        .unwrap_or_else(|| panic!("{}: no container runs {binary}", d.what()));
    assert!(
        !s(&c["image"]).is_empty(),
        "{}: container without image",
        d.what()
    );
    c
}

fn check_http_probe(d: &Doc, c: &Value, probe: &str, http_port: u64) {
    let p = &c[probe]["httpGet"];
    assert_eq!(
        s(&p["path"]),
        "/health",
        "{}: {probe} must GET /health",
        d.what()
    );
    assert_eq!(
        resolve_port(c, &p["port"]),
        Some(http_port),
        "{}: {probe} port must be the container's http port {http_port}",
        d.what()
    );
    // With TLS files the HTTP port serves HTTPS only.
    if uses_tls(c) {
        assert_eq!(
            s(&p["scheme"]),
            "HTTPS",
            "{}: {probe} must use scheme HTTPS (the container runs TLS)",
            d.what()
        );
    }
}

/// Masters and stores run secured: a token file and the three TLS files,
/// each from a Secret mounted read-only, never `--insecure`; Prometheus is
/// told to scrape HTTPS.
fn check_secured(d: &Doc, c: &Value) {
    let text = command_text(c);
    assert!(
        !text.contains("--insecure"),
        "{}: runs --insecure",
        d.what()
    );
    let env_value = |name: &str| {
        seq(&c["env"])
            .iter()
            .find(|e| s(&e["name"]) == name)
            .map(|e| s(&e["value"]).to_string())
    };
    assert!(
        env_value("CRESCENT_INSECURE").is_none(),
        "{}: sets CRESCENT_INSECURE",
        d.what()
    );
    let volumes = seq(&pod_template(d)["spec"]["volumes"]);
    for name in [
        "CRESCENT_TOKEN_FILE",
        "CRESCENT_TLS_CERT",
        "CRESCENT_TLS_KEY",
        "CRESCENT_TLS_CA",
    ] {
        let path = env_value(name).unwrap_or_else(|| panic!("{}: no {name}", d.what()));
        let mount = seq(&c["volumeMounts"])
            .iter()
            .find(|m| path.starts_with(&format!("{}/", s(&m["mountPath"]))))
            .unwrap_or_else(|| panic!("{}: {name}={path} is under no volume mount", d.what()));
        assert_eq!(
            mount["readOnly"].as_bool(),
            Some(true),
            "{}: mount {} must be read-only",
            d.what(),
            s(&mount["name"])
        );
        let volume = volumes
            .iter()
            .find(|v| s(&v["name"]) == s(&mount["name"]))
            .unwrap_or_else(|| panic!("{}: no volume {}", d.what(), s(&mount["name"])));
        assert!(
            volume["secret"]["secretName"].is_string(),
            "{}: {name} must come from a Secret",
            d.what()
        );
    }
    let a = &pod_template(d)["metadata"]["annotations"];
    assert_eq!(s(&a["prometheus.io/scheme"]), "https", "{}", d.what());
}

/// Whether a container is given TLS files (`CRESCENT_TLS_CERT`).
fn uses_tls(c: &Value) -> bool {
    seq(&c["env"])
        .iter()
        .any(|e| s(&e["name"]) == "CRESCENT_TLS_CERT")
}

fn check_scrape_annotations(d: &Doc, http_port: u64) {
    let a = &pod_template(d)["metadata"]["annotations"];
    assert_eq!(s(&a["prometheus.io/scrape"]), "true", "{}", d.what());
    assert_eq!(s(&a["prometheus.io/path"]), "/metrics", "{}", d.what());
    assert_eq!(
        s(&a["prometheus.io/port"]).parse::<u64>().ok(),
        Some(http_port),
        "{}: prometheus.io/port must be the http port",
        d.what()
    );
}

/// The port an address flag sets, when it is given explicitly, must be the
/// container port (the defaults are checked separately).
fn check_explicit_port(d: &Doc, c: &Value, flag: &str, port: u64) {
    for v in flag_values(&command_text(c), flag) {
        assert_eq!(
            port_of(&v),
            Some(port),
            "{}: {flag} {v} does not match container port {port}",
            d.what()
        );
    }
}

/// `kubernetes-validate` from the venv `scripts/install-deps.sh` makes.
fn kubernetes_validate() -> Option<PathBuf> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/pyenv/bin/kubernetes-validate");
    path.is_file().then_some(path)
}

/// Runs `kubernetes-validate --strict` on `files`: whether they all pass,
/// and what it said.
fn validate_strictly(validator: &Path, files: &[PathBuf]) -> (bool, String) {
    let out = Command::new(validator)
        .arg("--strict")
        .arg("--quiet")
        .args(files)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", validator.display()));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// Every manifest against the Kubernetes API's own schemas, strictly (an
/// unknown field fails, as `kubectl apply --validate=strict` would).
#[test]
fn kubernetes_manifests_pass_the_api_schemas() {
    let Some(validator) = kubernetes_validate() else {
        crescent_integration::skip_or_fail(
            "the Kubernetes schema check",
            "target/pyenv/bin/kubernetes-validate is missing (scripts/install-deps.sh installs it)",
        );
        return;
    };
    let files = manifest_files();
    assert_eq!(files.len(), 5, "the five manifests: {files:?}");
    let (passed, said) = validate_strictly(&validator, &files);
    assert!(passed, "the manifests fail the Kubernetes schemas:\n{said}");

    // The check can fail: a field the API does not know, and a wrong type.
    let broken = tempfile::tempdir().unwrap();
    let master =
        std::fs::read_to_string(deploy_dir().join("kubernetes/master-statefulset.yaml")).unwrap();
    for (name, edit) in [
        (
            "unknown-field.yaml",
            master.replacen("\nspec:\n", "\nspec:\n  replica: 3\n", 1),
        ),
        (
            "wrong-type.yaml",
            master.replacen("replicas: 3", "replicas: three", 1),
        ),
    ] {
        assert_ne!(edit, master, "{name}: the edit must change the manifest");
        let path = broken.path().join(name);
        std::fs::write(&path, edit).unwrap();
        let (passed, said) = validate_strictly(&validator, &[path]);
        assert!(!passed, "{name} passed the schema check: {said}");
    }
}

/// What the schemas cannot see: the manifests against each other and
/// against the binaries (ports, probes, selectors, flags, security).
#[test]
fn kubernetes_manifests_are_well_formed() {
    let docs = manifests();
    for d in &docs {
        assert!(
            d.v["metadata"]["namespace"].is_null(),
            "{}: leave the namespace to `kubectl apply -n`",
            d.what()
        );
    }
    let master_help = Help::of(MASTER);
    let store_help = Help::of(STORE);

    // Masters.
    let sts = find(&docs, "StatefulSet", MASTER);
    let spec = &sts.v["spec"];
    assert_eq!(spec["replicas"].as_u64(), Some(3), "{}", sts.what());
    assert_eq!(
        s(&spec["podManagementPolicy"]),
        "Parallel",
        "{}",
        sts.what()
    );
    let labels = &pod_template(sts)["metadata"]["labels"];
    assert!(
        selects(&spec["selector"]["matchLabels"], labels),
        "{}: selector must match the pod labels",
        sts.what()
    );
    let c = workload_container(sts, MASTER);
    let grpc = named_port(sts, c, "grpc");
    let http = named_port(sts, c, "http");
    assert_eq!(
        grpc,
        master_help.default_port("--listen"),
        "master grpc port"
    );
    assert_eq!(http, master_help.default_port("--http"), "master http port");
    check_explicit_port(sts, c, "--listen", grpc);
    check_explicit_port(sts, c, "--http", http);
    check_http_probe(sts, c, "readinessProbe", http);
    assert!(
        c["livenessProbe"].is_mapping(),
        "{}: needs a liveness probe",
        sts.what()
    );
    check_scrape_annotations(sts, http);
    check_secured(sts, c);
    assert!(
        c["resources"]["requests"].is_mapping(),
        "{}: set resource requests",
        sts.what()
    );
    let text = command_text(c);
    assert!(
        text.contains("--log-format json") || text.contains("--log-format=json"),
        "{}: masters log JSON",
        sts.what()
    );
    let node_id = flag_values(&text, "--node-id");
    assert!(
        node_id.len() == 1 && node_id[0].contains("+ 1"),
        "{}: --node-id must be the ordinal + 1, got {node_id:?}",
        sts.what()
    );
    // The data dir lives on a claim from the volumeClaimTemplates.
    let claims: Vec<&str> = seq(&spec["volumeClaimTemplates"])
        .iter()
        .map(|t| s(&t["metadata"]["name"]))
        .collect();
    assert!(
        !claims.is_empty(),
        "{}: needs a volumeClaimTemplate",
        sts.what()
    );
    let data_dir = flag_values(&text, "--data-dir");
    assert_eq!(data_dir.len(), 1, "{}: pass --data-dir once", sts.what());
    assert!(
        seq(&c["volumeMounts"]).iter().any(|m| {
            claims.contains(&s(&m["name"])) && data_dir[0].starts_with(s(&m["mountPath"]))
        }),
        "{}: --data-dir {} is not on a volumeClaimTemplate mount",
        sts.what(),
        data_dir[0]
    );

    // The headless Service that governs the StatefulSet.
    let governing = s(&spec["serviceName"]);
    let svc = find(&docs, "Service", governing);
    assert_eq!(s(&svc.v["spec"]["clusterIP"]), "None", "{}", svc.what());
    assert_eq!(
        svc.v["spec"]["publishNotReadyAddresses"].as_bool(),
        Some(true),
        "{}: Raft peers must reach each other before they are ready",
        svc.what()
    );
    assert!(
        selects(&svc.v["spec"]["selector"], labels),
        "{}: must select the master pods",
        svc.what()
    );
    // Masters advertise their per-pod name under it, on the grpc port.
    let advertise = flag_values(&text, "--advertise");
    assert!(
        advertise.len() == 1
            && advertise[0].contains(&format!(".{governing}."))
            && port_of(&advertise[0]) == Some(grpc),
        "{}: --advertise must be <pod>.{governing}.<ns>...:{grpc}, got {advertise:?}",
        sts.what()
    );

    // The PodDisruptionBudget keeps a quorum.
    let pdbs: Vec<&Doc> = docs
        .iter()
        .filter(|d| {
            d.kind() == "PodDisruptionBudget"
                && selects(&d.v["spec"]["selector"]["matchLabels"], labels)
        })
        .collect();
    assert_eq!(
        pdbs.len(),
        1,
        "exactly one PodDisruptionBudget must select the masters"
    );
    assert_eq!(
        pdbs[0].v["spec"]["minAvailable"].as_u64(),
        Some(2),
        "{}",
        pdbs[0].what()
    );

    // Stores.
    let ds = find(&docs, "DaemonSet", STORE);
    let store_labels = &pod_template(ds)["metadata"]["labels"];
    assert!(
        selects(&ds.v["spec"]["selector"]["matchLabels"], store_labels),
        "{}: selector must match the pod labels",
        ds.what()
    );
    assert!(
        !selects(&spec["selector"]["matchLabels"], store_labels),
        "the master selector must not match store pods"
    );
    let c = workload_container(ds, STORE);
    let transfer = named_port(ds, c, "transfer");
    let http = named_port(ds, c, "http");
    assert_eq!(
        transfer,
        store_help.default_port("--listen"),
        "store transfer port"
    );
    assert_eq!(http, store_help.default_port("--http"), "store http port");
    check_explicit_port(ds, c, "--listen", transfer);
    check_explicit_port(ds, c, "--http", http);
    check_http_probe(ds, c, "readinessProbe", http);
    check_scrape_annotations(ds, http);
    check_secured(ds, c);
    for v in flag_values(&command_text(c), "--advertise") {
        assert!(
            !v.contains(':'),
            "{}: the store's --advertise is a host (it appends the listen port), got {v}",
            ds.what()
        );
    }

    // Every Service's target ports exist on the pods it selects.
    for svc in docs.iter().filter(|d| d.kind() == "Service") {
        let targets: Vec<&Doc> = [sts, ds]
            .into_iter()
            .filter(|w| {
                selects(
                    &svc.v["spec"]["selector"],
                    &pod_template(w)["metadata"]["labels"],
                )
            })
            .collect();
        assert!(!targets.is_empty(), "{} selects no pods", svc.what());
        for w in targets {
            for p in seq(&svc.v["spec"]["ports"]) {
                let target = if p["targetPort"].is_null() {
                    &p["port"]
                } else {
                    &p["targetPort"]
                };
                assert!(
                    containers(w)
                        .iter()
                        .any(|c| resolve_port(c, target).is_some()),
                    "{}: targetPort {target:?} is not a port of {}",
                    svc.what(),
                    w.what()
                );
            }
        }
    }
}

/// Checks one container's flags and environment against its binary's --help;
/// returns how many flags were checked.
fn check_container_against_help(
    what: &str,
    text: &str,
    env: &[String],
    help: &BTreeMap<&str, Help>,
) -> usize {
    let Some(binary) = program_of(text) else {
        return 0;
    };
    let Some(h) = help.get(binary) else {
        return 0;
    };
    let flags = long_flags(text);
    for f in &flags {
        assert!(
            h.flags.contains(f),
            "{what}: {binary} has no flag {f} (see `{binary} --help`)"
        );
    }
    for e in env.iter().filter(|e| is_our_env(e)) {
        assert!(
            h.envs.contains(e),
            "{what}: {binary} reads no environment variable {e} (see `{binary} --help`)"
        );
    }
    flags.len()
}

#[test]
fn deploy_flags_and_env_exist_in_binaries() {
    let help: BTreeMap<&str, Help> = [MASTER, STORE]
        .into_iter()
        .map(|b| (b, Help::of(b)))
        .collect();
    let docs = manifests();
    let config_maps: BTreeMap<&str, &Value> = docs
        .iter()
        .filter(|d| d.kind() == "ConfigMap")
        .map(|d| (d.name(), &d.v["data"]))
        .collect();
    let mut checked = BTreeMap::<&str, usize>::new();
    for d in &docs {
        for c in containers(d) {
            let text = command_text(c);
            let what = format!("{} container {}", d.what(), s(&c["name"]));
            // Everything the container's environment holds: env and envFrom.
            let mut env: Vec<String> = Vec::new();
            for e in seq(&c["env"]) {
                env.push(s(&e["name"]).to_string());
                let r = &e["valueFrom"]["configMapKeyRef"];
                if r.is_mapping() {
                    let data = config_maps
                        .get(s(&r["name"]))
                        .unwrap_or_else(|| panic!("{what}: no ConfigMap {:?}", r["name"]));
                    assert!(
                        data.get(s(&r["key"])).is_some(),
                        "{what}: ConfigMap {} has no key {:?}",
                        s(&r["name"]),
                        r["key"]
                    );
                }
            }
            for from in seq(&c["envFrom"]) {
                let name = s(&from["configMapRef"]["name"]);
                if name.is_empty() {
                    continue;
                }
                let data = config_maps
                    .get(name)
                    .unwrap_or_else(|| panic!("{what}: no ConfigMap {name}"));
                if let Some(m) = data.as_mapping() {
                    env.extend(m.keys().map(|k| s(k).to_string()));
                }
            }
            // Every $(VAR)/${VAR} used in the command is defined (or assigned by the script).
            for var in referenced_vars(&text) {
                assert!(
                    env.contains(&var) || text.contains(&format!("{var}=")),
                    "{what}: the command uses ${var}, which the container does not define"
                );
            }
            let n = check_container_against_help(&what, &text, &env, &help);
            if let Some(b) = program_of(&text) {
                *checked.entry(b).or_default() += n;
            }
        }
    }
    for b in [MASTER, STORE] {
        assert!(
            checked.get(b).copied().unwrap_or(0) > 0,
            "no {b} flags found in deploy/kubernetes"
        );
    }

    // The docker-compose file, when there is one.
    let compose = deploy_dir().join("docker-compose.yml");
    if !compose.exists() {
        eprintln!("{} does not exist; skipping it", compose.display());
        return;
    }
    let text = std::fs::read_to_string(&compose).unwrap();
    let services = check_compose(&text, &help);
    assert!(
        services > 0,
        "docker-compose.yml runs no crescent binary in a command:"
    );
}

/// Checks the crescent services of a docker-compose file (`entrypoint:` plus
/// `command:`, and `environment:`) against the binaries' --help; returns how
/// many services run one of our binaries.
fn check_compose(text: &str, help: &BTreeMap<&str, Help>) -> usize {
    let v: Value = serde_yaml::from_str(text)
        .unwrap_or_else(|e| panic!("docker-compose.yml is not valid YAML: {e}"));
    let words = |v: &Value| -> String {
        match v {
            Value::String(s) => s.clone(),
            Value::Sequence(items) => items
                .iter()
                .map(|i| s(i).to_string())
                .collect::<Vec<_>>()
                .join(" "),
            _ => String::new(),
        }
    };
    let mut crescent_services = 0;
    for (name, svc) in v["services"].as_mapping().into_iter().flatten() {
        let text = format!("{} {}", words(&svc["entrypoint"]), words(&svc["command"]));
        let env: Vec<String> = match &svc["environment"] {
            Value::Mapping(m) => m.keys().map(|k| s(k).to_string()).collect(),
            Value::Sequence(items) => items
                .iter()
                .map(|i| s(i).split('=').next().unwrap_or("").to_string())
                .collect(),
            _ => Vec::new(),
        };
        let what = format!("docker-compose.yml service {}", s(name));
        if program_of(&text).is_some() {
            crescent_services += 1;
        }
        check_container_against_help(&what, &text, &env, help);
    }
    crescent_services
}

#[test]
fn compose_check_catches_unknown_flags_and_env() {
    let help: BTreeMap<&str, Help> = [MASTER, STORE]
        .into_iter()
        .map(|b| (b, Help::of(b)))
        .collect();
    let good = r#"
services:
  etcd:
    image: crescent:0.1.0
    command: ["etcd", "--listen-client-urls", "http://0.0.0.0:2379"]
  master-1:
    image: crescent:0.1.0
    command: crescent-master --node-id 1 --etcd etcd:2379 --log-format=json
    environment:
      CRESCENT_CLUSTER: demo
  store:
    image: crescent:0.1.0
    entrypoint: ["/bin/sh", "-c"]
    command:
      - |
        exec crescent-store --master etcd://etcd:2379/demo --advertise store
    environment:
      - CRESCENT_SEGMENT_SIZE=256mb
"#;
    assert_eq!(check_compose(good, &help), 2);
    for bad in [
        good.replace("--log-format=json", "--log-fmt=json"),
        good.replace("--advertise store", "--advertize store"),
        good.replace("CRESCENT_SEGMENT_SIZE", "CRESCENT_SEGMENT_SIZ"),
        good.replace("CRESCENT_CLUSTER", "CRESCENT_CLUSTR"),
    ] {
        let r = std::panic::catch_unwind(|| check_compose(&bad, &help));
        assert!(r.is_err(), "not caught:\n{bad}");
    }
}

#[test]
fn help_and_flag_parsing_helpers() {
    let h = Help::parse(
        "x",
        "Usage: x [OPTIONS]\n\nOptions:\n      --listen <LISTEN>\n          Listen [env: X_LISTEN=] [default: 0.0.0.0:1234]\n      --name <NAME>\n          Name [default: <endpoint>] [env: X_NAME=] [default: \"\"]\n  -h, --help\n          Print help\n",
    );
    assert_eq!(h.flags.len(), 3);
    assert!(h.envs.contains("X_LISTEN") && h.envs.contains("X_NAME"));
    assert_eq!(h.default_port("--listen"), 1234);
    assert_eq!(h.defaults["--name"], "\"\"");
    let script = "exec crescent-master \\\n  --node-id \"$((n + 1))\" --advertise=\"${POD}.svc:50051\" --join";
    assert_eq!(long_flags(script), ["--node-id", "--advertise", "--join"]);
    assert_eq!(flag_values(script, "--node-id"), ["$((n + 1))"]);
    assert_eq!(flag_values(script, "--advertise"), ["${POD}.svc:50051"]);
    assert_eq!(program_of(script), Some(MASTER));
    assert_eq!(
        program_of("/usr/local/bin/crescent-store --master=x"),
        Some(STORE)
    );
    assert_eq!(program_of("etcd --name crescent-master"), None);
    assert_eq!(
        program_of("sh -c 'set -e; x=1 exec crescent-store --master=a'"),
        Some(STORE)
    );
    assert_eq!(shell_words("a \"b c\"\\\n d='e f'"), ["a", "b c", "d=e f"]);
    assert_eq!(
        referenced_vars("$(A) ${B##*-} $((1 + 2)) $C"),
        ["A".to_string(), "B".to_string()].into_iter().collect()
    );
}

// ---------------------------------------------------------------------------
// Grafana dashboard
// ---------------------------------------------------------------------------

/// Metric names a PromQL expression selects: identifiers outside label
/// matchers, label lists (`by (...)`, `on (...)`, ...), strings, range
/// brackets and `$variables`, that are neither keywords, aggregations nor
/// function calls.
fn metric_names(expr: &str) -> Vec<String> {
    const KEYWORDS: [&str; 26] = [
        "and",
        "or",
        "unless",
        "offset",
        "bool",
        "atan2",
        "inf",
        "nan",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
    ];
    const LABEL_LIST: [&str; 6] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let c: Vec<char> = expr.chars().collect();
    let next_non_space = |mut j: usize| {
        while j < c.len() && c[j].is_whitespace() {
            j += 1;
        }
        c.get(j).copied()
    };
    let mut out = Vec::new();
    let (mut i, mut braces, mut parens) = (0, 0usize, 0usize);
    let mut label_list_at: Option<usize> = None;
    let mut expect_label_list = false;
    while i < c.len() {
        let ch = c[i];
        match ch {
            '"' | '\'' | '`' => {
                i += 1;
                while i < c.len() && c[i] != ch {
                    i += if c[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
            }
            '{' => {
                braces += 1;
                i += 1;
            }
            '}' => {
                braces = braces.saturating_sub(1);
                i += 1;
            }
            '(' => {
                parens += 1;
                if expect_label_list {
                    label_list_at = Some(parens);
                    expect_label_list = false;
                }
                i += 1;
            }
            ')' => {
                if label_list_at == Some(parens) {
                    label_list_at = None;
                }
                parens = parens.saturating_sub(1);
                i += 1;
            }
            '[' => {
                while i < c.len() && c[i] != ']' {
                    i += 1;
                }
                i += 1;
            }
            '$' => {
                i += 1;
                if c.get(i) == Some(&'{') {
                    while i < c.len() && c[i] != '}' {
                        i += 1;
                    }
                    i += 1;
                } else {
                    while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                        i += 1;
                    }
                }
            }
            _ if ch.is_ascii_digit() || ch == '.' => {
                while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '.') {
                    i += 1;
                }
            }
            _ if ch.is_ascii_alphabetic() || ch == '_' || ch == ':' => {
                let start = i;
                while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '_' || c[i] == ':') {
                    i += 1;
                }
                let word: String = c[start..i].iter().collect();
                let lower = word.to_ascii_lowercase();
                if braces > 0 || label_list_at.is_some() {
                    continue;
                }
                if LABEL_LIST.contains(&lower.as_str()) {
                    expect_label_list = next_non_space(i) == Some('(');
                    continue;
                }
                if KEYWORDS.contains(&lower.as_str()) || next_non_space(i) == Some('(') {
                    continue;
                }
                out.push(word);
            }
            _ => i += 1,
        }
    }
    out
}

/// The metric names in a Grafana variable query: `label_values(metric, label)`
/// names a metric (or selector) first; `label_values(label)` none; anything
/// else is PromQL.
fn variable_metric_names(query: &str) -> Vec<String> {
    let q = query.trim();
    if let Some(args) = q
        .strip_prefix("label_values(")
        .and_then(|r| r.strip_suffix(')'))
    {
        return match args.rsplit_once(',') {
            Some((selector, _label)) => metric_names(selector),
            None => Vec::new(),
        };
    }
    if let Some(inner) = q
        .strip_prefix("query_result(")
        .and_then(|r| r.strip_suffix(')'))
    {
        return metric_names(inner);
    }
    if q.starts_with("label_names(") {
        return Vec::new();
    }
    metric_names(q)
}

/// Series names and `# TYPE` families in Prometheus text.
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(name) = rest.split_whitespace().next() {
                out.insert(name.to_string());
            }
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            out.insert(line[..end].to_string());
        }
    }
    out
}

#[test]
fn metric_name_extraction() {
    assert_eq!(
        metric_names(
            "histogram_quantile(0.99, sum by (le) (rate(raft_proposal_seconds_bucket{namespace=~\"$namespace\", x_y=\"master_fake\"}[$__rate_interval])))"
        ),
        ["raft_proposal_seconds_bucket"]
    );
    assert_eq!(
        metric_names("max(master_key_count and on(instance) (raft_is_leader == 1)) / max by (segment_name) (segment_capacity_bytes) offset 5m"),
        ["master_key_count", "raft_is_leader", "segment_capacity_bytes"]
    );
    assert_eq!(
        metric_names("a_b * on(instance) group_left(pod_name) c_d"),
        ["a_b", "c_d"]
    );
    assert_eq!(
        variable_metric_names("label_values(raft_term{job=\"x\"}, kubernetes_namespace)"),
        ["raft_term"]
    );
    assert!(variable_metric_names("label_values(namespace)").is_empty());
    let known = exported_names("# HELP x_seconds t\n# TYPE x_seconds histogram\nx_seconds_bucket{le=\"1\"} 0\nup_total 3\n");
    assert!(
        known.contains("x_seconds")
            && known.contains("x_seconds_bucket")
            && known.contains("up_total")
    );
}

/// Every query of every panel (rows' nested panels too) and of the variables.
fn dashboard_queries(dash: &serde_json::Value) -> Vec<(String, String)> {
    fn walk(panels: &[serde_json::Value], out: &mut Vec<(String, String)>) {
        for p in panels {
            let title = p["title"].as_str().unwrap_or("?").to_string();
            if p["type"] == "row" {
                walk(
                    p["panels"].as_array().map(Vec::as_slice).unwrap_or(&[]),
                    out,
                );
                continue;
            }
            assert!(
                p["datasource"]["uid"].is_string() || p["datasource"].is_string(),
                "panel {title:?} has no datasource"
            );
            let targets = p["targets"].as_array().map(Vec::as_slice).unwrap_or(&[]);
            assert!(!targets.is_empty(), "panel {title:?} has no targets");
            for t in targets {
                let expr = t["expr"].as_str().unwrap_or("");
                assert!(
                    !expr.trim().is_empty(),
                    "panel {title:?} has a target without expr"
                );
                out.push((format!("panel {title:?}"), expr.to_string()));
            }
        }
    }
    let mut out = Vec::new();
    walk(
        dash["panels"].as_array().map(Vec::as_slice).unwrap_or(&[]),
        &mut out,
    );
    for var in dash["templating"]["list"].as_array().into_iter().flatten() {
        if var["type"] != "query" {
            continue;
        }
        let q = match &var["query"] {
            serde_json::Value::String(s) => s.clone(),
            q => q["query"].as_str().unwrap_or("").to_string(),
        };
        out.push((format!("variable {}", var["name"]), q));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grafana_dashboard_uses_exported_metrics() {
    let path = deploy_dir().join("grafana/crescent-dashboard.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let dash: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", path.display()));
    assert!(dash["title"].is_string() && dash["uid"].is_string());
    assert!(
        dash["schemaVersion"].as_u64().is_some_and(|v| v >= 36),
        "schemaVersion"
    );
    let ds_vars: Vec<&str> = dash["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["type"] == "datasource" && v["query"] == "prometheus")
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert!(
        !ds_vars.is_empty(),
        "the dashboard needs a Prometheus datasource variable"
    );
    let queries = dashboard_queries(&dash);

    // What the binaries really export.
    let mut cluster = LocalCluster::start(1, &[]).unwrap();
    cluster.with_mounted_store("64mb").await.unwrap();
    let mut exported = BTreeSet::new();
    for addr in [
        cluster.masters[0].http.clone(),
        cluster.stores[0].http.clone(),
    ] {
        let (code, body) = http_request(&addr, "GET", "/metrics", &[]).await.unwrap();
        assert_eq!(code, 200, "GET http://{addr}/metrics: {body}");
        exported.extend(exported_names(&body));
    }
    // The extraction would catch a misspelling.
    assert!(!exported.contains("master_key_cuont"));
    assert_eq!(metric_names("max(master_key_cuont)"), ["master_key_cuont"]);

    let mut used = BTreeSet::new();
    let mut unknown = Vec::new();
    for (place, expr) in &queries {
        for name in variable_metric_names(expr) {
            if !exported.contains(&name) {
                unknown.push(format!("{place}: {name} in {expr}"));
            }
            used.insert(name);
        }
    }
    assert!(
        unknown.is_empty(),
        "the dashboard queries metrics the binaries do not export:\n{}\nexported: {exported:?}",
        unknown.join("\n")
    );
    for p in dash["panels"].as_array().into_iter().flatten() {
        if let Some(uid) = p["datasource"]["uid"].as_str() {
            let var = uid.trim_start_matches("${").trim_end_matches('}');
            assert!(
                ds_vars.contains(&var),
                "panel {:?} uses datasource {uid}, not a datasource variable",
                p["title"]
            );
        }
    }
    // The panels operators need are there.
    for name in [
        "raft_is_leader",
        "raft_term",
        "raft_leader_changes_total",
        "raft_follower_lag",
        "raft_proposal_seconds_bucket",
        "master_allocated_bytes",
        "master_total_capacity_bytes",
        "master_key_count",
        "master_put_start_requests_total",
        "master_get_replica_list_requests_total",
        "master_evicted_key_count",
        "store_bytes_read_total",
        "store_transfer_seconds_bucket",
        "master_disk_allocated_bytes",
        "master_demotions_total",
        "store_disk_read_bytes_total",
    ] {
        assert!(used.contains(name), "the dashboard does not graph {name}");
    }
}
