//! docker-compose.yml, the production topology, against the binary it runs.
//!
//! Every service built from our Dockerfile runs `spindle <command>`: its command (a YAML list,
//! no shell) and its environment must be accepted by spindle's own command line (the real clap
//! `Cli`, in-process, then the same configuration checks the binary makes before it starts),
//! and every option and variable it uses must appear in `spindle <command> --help` of the built
//! binary. The rest of the file is checked for its shape: both MySQL servers host JobDBs, two
//! Directors, health checks everywhere, start-up ordered by health, the Dockerfile on the
//! workspace's Rust. Nothing is started: no Docker here.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::process::Command as Process;

use clap::{CommandFactory, Parser};
use serde_norway::{Mapping, Value};
use spindle::cli::{Cli, Command, DashboardRegistry, RegistryKind};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// docker-compose.yml, with its `<<` merge keys applied (as Compose does).
fn compose() -> Value {
    let path = format!("{ROOT}/docker-compose.yml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut value: Value =
        serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{path} is not YAML: {e}"));
    value
        .apply_merge()
        .expect("merge keys of docker-compose.yml");
    value
}

/// The services, by name.
fn services(compose: &Value) -> BTreeMap<String, Mapping> {
    compose["services"]
        .as_mapping()
        .expect("a `services` mapping")
        .iter()
        .map(|(name, service)| {
            (
                name.as_str().expect("service names are strings").to_owned(),
                service
                    .as_mapping()
                    .unwrap_or_else(|| panic!("service {name:?} is a mapping"))
                    .clone(),
            )
        })
        .collect()
}

/// A string field of a service.
fn string<'a>(service: &'a Mapping, key: &str) -> Option<&'a str> {
    service.get(key).and_then(Value::as_str)
}

/// Whether the service's image is built from our Dockerfile at the repository root.
fn built_here(service: &Mapping) -> bool {
    match service.get("build") {
        Some(Value::String(context)) => context == ".",
        Some(Value::Mapping(build)) => {
            build.get("context").and_then(Value::as_str) == Some(".")
                && build
                    .get("dockerfile")
                    .and_then(Value::as_str)
                    .is_none_or(|f| f == "Dockerfile")
        }
        _ => false,
    }
}

/// A spindle service: its command (after the `spindle` entrypoint) and environment.
struct Spindle {
    name: String,
    command: Vec<String>,
    environment: Vec<(String, String)>,
}

impl Spindle {
    /// The subcommand (`director`, `router`, ...).
    fn subcommand(&self) -> &str {
        &self.command[0]
    }

    /// The long options the command uses, as written (`--s3-bucket`).
    fn long_flags(&self) -> Vec<&str> {
        self.command
            .iter()
            .filter(|a| a.starts_with("--"))
            .map(|a| a.split_once('=').map_or(a.as_str(), |(flag, _)| flag))
            .collect()
    }

    /// The values given to `--flag` (as `--flag value` or `--flag=value`).
    fn values(&self, flag: &str) -> Vec<&str> {
        let mut values = Vec::new();
        for (i, arg) in self.command.iter().enumerate() {
            if arg == flag {
                if let Some(value) = self.command.get(i + 1) {
                    values.push(value.as_str());
                }
            } else if let Some(value) = arg
                .strip_prefix(flag)
                .and_then(|rest| rest.strip_prefix('='))
            {
                values.push(value);
            }
        }
        values
    }

    /// The one value of `--flag`.
    fn value(&self, flag: &str) -> &str {
        match self.values(flag).as_slice() {
            [one] => one,
            other => panic!("{}: expected one {flag}, found {other:?}", self.name),
        }
    }

    /// The value of an environment variable.
    fn env(&self, name: &str) -> Option<&str> {
        self.environment
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A scalar of an `environment` mapping, as Compose passes it.
fn scalar(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null => String::new(),
        other => panic!("environment values are scalars, not {other:?}"),
    }
}

/// A service's environment, from either of Compose's two forms.
fn environment(name: &str, service: &Mapping) -> Vec<(String, String)> {
    match service.get("environment") {
        None => Vec::new(),
        Some(Value::Mapping(map)) => map
            .iter()
            .map(|(k, v)| (k.as_str().expect("variable names").to_owned(), scalar(v)))
            .collect(),
        Some(Value::Sequence(list)) => list
            .iter()
            .map(|item| {
                let item = item.as_str().expect("`KEY=value` items");
                let (k, v) = item.split_once('=').unwrap_or((item, ""));
                (k.to_owned(), v.to_owned())
            })
            .collect(),
        Some(other) => panic!("{name}: environment must be a mapping or a list, not {other:?}"),
    }
}

/// Every service run from our image.
fn spindles(services: &BTreeMap<String, Mapping>) -> Vec<Spindle> {
    let spindles: Vec<Spindle> = services
        .iter()
        .filter(|(_, service)| built_here(service))
        .map(|(name, service)| {
            let command = match service.get("command") {
                Some(Value::Sequence(items)) => items
                    .iter()
                    .map(|item| match item {
                        Value::String(s) => s.clone(),
                        other => panic!(
                            "{name}: command item {other:?} must be a YAML string (quote numbers)"
                        ),
                    })
                    .collect::<Vec<_>>(),
                other => panic!("{name}: command must be a list (no shell parsing), not {other:?}"),
            };
            assert!(!command.is_empty(), "{name}: empty command");
            assert!(
                service.get("entrypoint").is_none(),
                "{name}: the image's entrypoint (`spindle`) must stay"
            );
            Spindle {
                name: name.clone(),
                command,
                environment: environment(name, service),
            }
        })
        .collect();
    assert!(
        !spindles.is_empty(),
        "no service is built from the Dockerfile"
    );
    spindles
}

/// Host and port of a URL such as `http://consul:8500` or `mysql://u:p@db:3306`.
fn host_of(url: &str) -> String {
    url::Url::parse(url)
        .unwrap_or_else(|e| panic!("{url}: {e}"))
        .host_str()
        .unwrap_or_else(|| panic!("{url}: no host"))
        .to_owned()
}

/// Services whose image starts with `prefix`.
fn with_image(services: &BTreeMap<String, Mapping>, prefix: &str) -> BTreeSet<String> {
    services
        .iter()
        .filter(|(_, s)| {
            string(s, "image").is_some_and(|i| i.starts_with(prefix)) && !built_here(s)
        })
        .map(|(name, _)| name.clone())
        .collect()
}

/// The argv a service runs, with its environment turned into the options that declare those
/// variables (clap reads the process environment, which tests running in threads must not
/// change). Fails when a variable is declared by no option of that subcommand.
fn argv(root: &clap::Command, spindle: &Spindle) -> Result<Vec<String>, String> {
    let sub = root.find_subcommand(spindle.subcommand()).ok_or_else(|| {
        format!(
            "{}: `spindle {}` is no subcommand",
            spindle.name,
            spindle.subcommand()
        )
    })?;
    let mut argv = vec!["spindle".to_owned()];
    argv.extend(spindle.command.iter().cloned());
    for (name, value) in &spindle.environment {
        let arg = sub
            .get_arguments()
            .find(|a| a.get_env().is_some_and(|env| env == name.as_str()))
            .ok_or_else(|| {
                format!(
                    "{}: environment variable {name} is read by no option of `spindle {}`",
                    spindle.name,
                    spindle.subcommand()
                )
            })?;
        let long = arg
            .get_long()
            .ok_or_else(|| format!("{}: {name} belongs to a positional", spindle.name))?;
        if spindle.long_flags().contains(&format!("--{long}").as_str()) {
            // The option given on the command line wins over its variable, as in clap.
            continue;
        }
        if arg.get_action().takes_values() {
            argv.push(format!("--{long}={value}"));
        } else if !matches!(
            value.to_ascii_lowercase().as_str(),
            "" | "0" | "false" | "no" | "off" | "n" | "f"
        ) {
            argv.push(format!("--{long}"));
        }
    }
    Ok(argv)
}

/// The real CLI, built (global options propagated to the subcommands).
fn cli() -> clap::Command {
    let mut root = Cli::command();
    root.build();
    root
}

#[test]
fn every_spindle_service_parses_with_the_binarys_own_cli() {
    let compose = compose();
    let services = services(&compose);
    let root = cli();
    let mut failures = Vec::new();
    for spindle in spindles(&services) {
        let argv = match argv(&root, &spindle) {
            Ok(argv) => argv,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        let cli = match Cli::try_parse_from(&argv) {
            Ok(cli) => cli,
            Err(e) => {
                // The command as written (the environment's values may be secrets).
                failures.push(format!(
                    "{}: spindle {}:\n{}",
                    spindle.name,
                    spindle.command.join(" "),
                    e.render()
                ));
                continue;
            }
        };
        // The checks the binary makes before it connects to anything.
        let checked = match &cli.command {
            Command::Director(args) => args.to_config().map(drop),
            Command::Manager(args) => args.to_config().map(drop),
            Command::Drainer(args) => args.to_config().map(drop),
            Command::Dashboard(args) => args.to_config().map(drop),
            Command::Router(args) => args.redis.iter().try_for_each(|entry| {
                let (id, url) = entry
                    .split_once('=')
                    .ok_or_else(|| anyhow::anyhow!("--redis {entry}: expected id=url"))?;
                anyhow::ensure!(
                    spindle::router::placement::valid_store_id(id) && url.starts_with("redis://"),
                    "--redis {entry}"
                );
                Ok(())
            }),
            _ => Err(anyhow::anyhow!("a long-running role was expected")),
        };
        if let Err(e) = checked {
            failures.push(format!("{}: {e:#}", spindle.name));
        }
    }
    assert!(
        failures.is_empty(),
        "docker-compose.yml runs spindle with options its CLI refuses:\n{}",
        failures.join("\n")
    );
}

#[test]
fn every_flag_and_variable_is_in_the_binarys_help() {
    let compose = compose();
    let mut helps: BTreeMap<String, String> = BTreeMap::new();
    let mut failures = Vec::new();
    for spindle in spindles(&services(&compose)) {
        let help = helps
            .entry(spindle.subcommand().to_owned())
            .or_insert_with(|| {
                let out = Process::new(env!("CARGO_BIN_EXE_spindle"))
                    .args([spindle.subcommand(), "--help"])
                    .output()
                    .expect("run spindle --help");
                assert!(
                    out.status.success(),
                    "spindle {} --help: {}",
                    spindle.subcommand(),
                    String::from_utf8_lossy(&out.stderr)
                );
                String::from_utf8(out.stdout).expect("utf-8 help")
            });
        for flag in spindle.long_flags() {
            // The flag itself, not a longer one it begins: `--s3-bucket` is not `--s3-bucket-x`.
            let listed = help.match_indices(flag).any(|(at, _)| {
                !help[at + flag.len()..]
                    .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-')
            });
            if !listed {
                failures.push(format!(
                    "{}: {flag} is not in `spindle {} --help`",
                    spindle.name,
                    spindle.subcommand()
                ));
            }
        }
        for (name, _) in &spindle.environment {
            if !help.contains(&format!("[env: {name}")) {
                failures.push(format!(
                    "{}: {name} is not in `spindle {} --help`",
                    spindle.name,
                    spindle.subcommand()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn topology_has_its_parts_health_checks_and_ordering() {
    let compose = compose();
    let services = services(&compose);
    let spindles = spindles(&services);
    let mut failures: Vec<String> = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            failures.push(what);
        }
    };

    // The roles: two Directors (or more), and each of the others.
    let mut roles: BTreeMap<&str, Vec<&Spindle>> = BTreeMap::new();
    for s in &spindles {
        roles.entry(s.subcommand()).or_default().push(s);
    }
    let count = |role: &str| roles.get(role).map_or(0, Vec::len);
    check(
        count("director") >= 2,
        format!("at least 2 Directors, not {}", count("director")),
    );
    for role in ["router", "manager", "drainer", "dashboard"] {
        check(count(role) >= 1, format!("a {role}, not {}", count(role)));
    }

    // The infrastructure.
    let mysql = with_image(&services, "mysql:8.0");
    let consul = with_image(&services, "hashicorp/consul");
    let redis = with_image(&services, "redis:");
    check(
        mysql.len() >= 2,
        format!("JobDBs on two mysql:8.0 servers at least, not {mysql:?}"),
    );
    check(
        consul.len() == 1,
        format!("one Consul agent, not {consul:?}"),
    );
    check(
        redis.len() >= 2,
        format!("two Redis stores at least, not {redis:?}"),
    );
    for name in &consul {
        let command = services[name].get("command").and_then(Value::as_sequence);
        let command: Vec<&str> = command
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        check(
            command.starts_with(&["agent", "-dev", "-client", "0.0.0.0"]),
            format!("{name}: `agent -dev -client 0.0.0.0`, not {command:?}"),
        );
    }

    // Health checks everywhere; start-up waits for health.
    for (name, service) in &services {
        let test = service
            .get("healthcheck")
            .and_then(|h| h.get("test"))
            .and_then(Value::as_sequence);
        let test: Vec<&str> = test
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        check(
            matches!(test.first(), Some(&"CMD") | Some(&"CMD-SHELL")) && test.len() > 1,
            format!("{name}: a healthcheck with a CMD or CMD-SHELL test, not {test:?}"),
        );
        check(
            service
                .get("healthcheck")
                .and_then(|h| h.get("disable"))
                .is_none(),
            format!("{name}: healthcheck disabled"),
        );
        match service.get("depends_on") {
            None => {}
            Some(Value::Mapping(deps)) => {
                for (dep, how) in deps {
                    let dep = dep.as_str().unwrap_or_default();
                    check(
                        services.contains_key(dep),
                        format!("{name}: depends on unknown {dep}"),
                    );
                    check(
                        how.get("condition").and_then(Value::as_str) == Some("service_healthy"),
                        format!("{name}: depends on {dep} without condition: service_healthy"),
                    );
                }
            }
            Some(_) => check(
                false,
                format!("{name}: depends_on as a list waits for no health"),
            ),
        }
    }

    // spindle's own checks: curl (installed in the image) on the port it listens on.
    for s in &spindles {
        let test: Vec<&str> = services[&s.name]["healthcheck"]["test"]
            .as_sequence()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let listen = match s.subcommand() {
            "manager" | "drainer" => "--metrics-listen",
            _ => "--listen",
        };
        let port = s
            .values(listen)
            .first()
            .and_then(|a| a.parse::<SocketAddr>().ok())
            .map(|a| a.port());
        let path = match s.subcommand() {
            "director" | "router" => "/readyz",
            _ => "/healthz",
        };
        let url = port.map(|p| format!("http://127.0.0.1:{p}{path}"));
        check(
            test.starts_with(&["CMD", "curl", "--fail"])
                && url.as_deref().is_some_and(|u| test.contains(&u)),
            format!(
                "{}: healthcheck `curl --fail ... {url:?}`, not {test:?}",
                s.name
            ),
        );
        check(
            s.values(listen)
                .first()
                .and_then(|a| a.parse::<SocketAddr>().ok())
                .is_some_and(|a| a.ip().is_unspecified()),
            format!("{}: {listen} must bind 0.0.0.0 to be reachable", s.name),
        );
        for addr in s.values("--consul-addr") {
            check(
                consul.contains(&host_of(addr)),
                format!("{}: --consul-addr {addr} is not the Consul service", s.name),
            );
        }
        if s.subcommand() != "dashboard" {
            check(
                !s.values("--consul-addr").is_empty(),
                format!("{}: --consul-addr", s.name),
            );
        }
    }

    // JobDBs spread over both MySQL servers, with their root password.
    for manager in roles.get("manager").into_iter().flatten() {
        let servers: BTreeSet<String> = manager
            .values("--mysql")
            .iter()
            .map(|u| host_of(u))
            .collect();
        check(
            servers == mysql,
            format!("manager: --mysql names {servers:?}, the servers are {mysql:?}"),
        );
        for url in manager.values("--mysql") {
            let parsed = url::Url::parse(url).expect("mysql url");
            let host = parsed.host_str().unwrap_or_default();
            let root = services
                .get(host)
                .and_then(|s| s.get("environment"))
                .and_then(|e| e.get("MYSQL_ROOT_PASSWORD"))
                .and_then(Value::as_str);
            check(
                parsed.username() == "root" && parsed.password() == root,
                format!("manager: {url} must log in as root with {host}'s MYSQL_ROOT_PASSWORD"),
            );
            check(
                spindle::manager::server_jobdb_url(url, "spindle_probe").is_ok(),
                format!("manager: {url} is no server URL"),
            );
        }
    }

    // The router uses both Redis stores.
    for router in roles.get("router").into_iter().flatten() {
        let stores: BTreeSet<String> = router
            .values("--redis")
            .iter()
            .filter_map(|e| e.split_once('='))
            .map(|(_, url)| host_of(url))
            .collect();
        check(
            stores == redis,
            format!("router: --redis names {stores:?}, the stores are {redis:?}"),
        );
    }

    // Directors: Consul registry, each its own id and advertised address, which must be the
    // container's fixed address (the catalog takes an IP) on the listen port.
    let subnet: Option<ipnet::IpNet> = compose["networks"]["default"]["ipam"]["config"][0]
        ["subnet"]
        .as_str()
        .and_then(|s| s.parse().ok());
    let dynamic: Option<ipnet::IpNet> = compose["networks"]["default"]["ipam"]["config"][0]
        ["ip_range"]
        .as_str()
        .and_then(|s| s.parse().ok());
    let mut ids = BTreeSet::new();
    for d in roles.get("director").into_iter().flatten() {
        check(
            d.value("--registry") == "consul",
            format!("{}: --registry consul", d.name),
        );
        ids.insert(d.value("--director-id").to_owned());
        let advertise: SocketAddr = d.value("--advertise").parse().expect("--advertise");
        let listen: SocketAddr = d.value("--listen").parse().expect("--listen");
        let fixed = services[&d.name]["networks"]["default"]["ipv4_address"].as_str();
        check(
            fixed == Some(advertise.ip().to_string().as_str()) && advertise.port() == listen.port(),
            format!(
                "{}: --advertise {advertise} is not its ipv4_address {fixed:?} and --listen port",
                d.name
            ),
        );
        check(
            subnet.is_some_and(|n| n.contains(&advertise.ip()))
                && dynamic.is_some_and(|r| !r.contains(&advertise.ip())),
            format!(
                "{}: {advertise} must be in the subnet {subnet:?}, outside ip_range {dynamic:?}",
                d.name
            ),
        );
        check(
            string(&services[&d.name], "stop_grace_period").is_some(),
            format!("{}: a stop_grace_period for the shutdown grace", d.name),
        );
    }
    check(
        ids.len() == count("director"),
        format!("distinct --director-id, not {ids:?}"),
    );

    // Directors and the drainer share one archive, with the S3 store's credentials.
    let mut archives = BTreeSet::new();
    for s in spindles
        .iter()
        .filter(|s| matches!(s.subcommand(), "director" | "drainer"))
    {
        archives.insert((
            s.value("--s3-bucket").to_owned(),
            s.value("--s3-endpoint").to_owned(),
        ));
        let store = host_of(s.value("--s3-endpoint"));
        let env = services
            .get(&store)
            .and_then(|svc| svc.get("environment"))
            .cloned()
            .unwrap_or(Value::Null);
        check(
            s.env("SPINDLE_S3_ACCESS_KEY_ID") == env["MINIO_ROOT_USER"].as_str()
                && s.env("SPINDLE_S3_SECRET_ACCESS_KEY") == env["MINIO_ROOT_PASSWORD"].as_str(),
            format!("{}: the S3 credentials of {store}", s.name),
        );
        check(
            services
                .get(&store)
                .is_some_and(|svc| svc.get("healthcheck").is_some()),
            format!("{}: --s3-endpoint names no service", s.name),
        );
    }
    check(
        archives.len() == 1,
        format!("one archive for all, not {archives:?}"),
    );

    // And the parsed values agree (the same argv as the binary would get).
    let root = cli();
    for s in &spindles {
        let Ok(argv) = argv(&root, s) else { continue };
        match Cli::try_parse_from(&argv).map(|c| c.command) {
            Ok(Command::Director(args)) => check(
                args.registry == RegistryKind::Consul && args.s3.s3_path_style,
                format!("{}: parsed as a Consul Director with path-style S3", s.name),
            ),
            Ok(Command::Dashboard(args)) => check(
                args.registry == DashboardRegistry::Consul,
                format!("{}: the dashboard reads the inventory", s.name),
            ),
            Ok(Command::Manager(args)) => check(
                args.mysql.len() == 2,
                format!("{}: parsed two --mysql", s.name),
            ),
            _ => {}
        }
    }

    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn dockerfile_builds_with_the_workspace_toolchain() {
    let read = |name: &str| {
        std::fs::read_to_string(format!("{ROOT}/{name}")).unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    let manifest = read("Cargo.toml");
    let rust = manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("rust-version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("the workspace's rust-version");
    let dockerfile = read("Dockerfile");
    let lines: Vec<&str> = dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    let froms: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert_eq!(
        froms,
        [
            format!("FROM rust:{rust}-bookworm AS builder").as_str(),
            "FROM debian:bookworm-slim"
        ],
        "builder on the workspace's Rust, runtime on the same Debian"
    );
    assert!(
        dockerfile.contains("cargo build --release --locked -p spindle --bin spindle"),
        "a release build of the spindle binary"
    );
    assert!(
        dockerfile.contains("ca-certificates curl"),
        "the runtime has CA certificates and curl (the health checks use it)"
    );
    let user = lines
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("a USER");
    assert!(
        !user.starts_with("root") && !user.starts_with('0'),
        "non-root, not {user}"
    );
    assert_eq!(
        lines.iter().rev().find(|l| l.starts_with("ENTRYPOINT")),
        Some(&r#"ENTRYPOINT ["spindle"]"#)
    );
    let ignored = read(".dockerignore");
    for path in ["target/", "fuzz/target/", ".git/"] {
        assert!(
            ignored.lines().any(|l| l.trim() == path),
            ".dockerignore leaves out {path}"
        );
    }
}

/// `docker-compose`, installed from Debian (`apt-get`) if missing, as the dashboard test does
/// with Chromium. Its `config` needs no Docker daemon.
fn docker_compose() -> &'static str {
    common::debian_tool("docker-compose", "version", "docker-compose")
}

#[test]
fn docker_compose_config_is_clean() {
    let out = Process::new(docker_compose())
        .args([
            "-f",
            &format!("{ROOT}/docker-compose.yml"),
            "config",
            "--quiet",
        ])
        .current_dir(ROOT)
        .output()
        .expect("run docker-compose config");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "docker-compose config: {}\n{stderr}",
        out.status
    );
}
