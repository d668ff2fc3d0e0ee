//! Secrets never show: not in the `Debug` of any command line or configuration (a logged
//! `?config`, a panic message), and JobDB passwords never reach Consul KV, where anyone with a
//! read token could see them.

mod common;

use chrono::Utc;
use clap::Parser;
use common::ConsulUnderTest;
use spindle::cli::{Cli, Command};
use spindle::registry::inventory::{Inventory, JobDbRecord, JobDbState};
use spindle::secret::Secret;

const SECRET: &str = "Hunter2xSecret";

fn parse(args: &[&str]) -> Cli {
    let args: Vec<String> = args.iter().map(|a| a.replace("{S}", SECRET)).collect();
    Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

#[test]
fn no_secret_shows_in_the_debug_of_a_command_line_or_a_configuration() {
    let lines: [&[&str]; 12] = [
        &[
            "spindle",
            "director",
            "--jobdb",
            "mysql://app:{S}@db:3306/jobdb_1",
            "--consul-token",
            "{S}",
            "--jobdb-password",
            "{S}",
            "--s3-bucket",
            "b",
            "--s3-access-key-id",
            "id",
            "--s3-secret-access-key",
            "{S}",
        ],
        &[
            "spindle",
            "manager",
            "--mysql",
            "mysql://app:{S}@db:3306",
            "--consul-token",
            "{S}",
            "--jobdb-password",
            "{S}",
        ],
        &[
            "spindle",
            "drainer",
            "--s3-bucket",
            "b",
            "--s3-access-key-id",
            "id",
            "--s3-secret-access-key",
            "{S}",
            "--import-token",
            "{S}",
            "--consul-token",
            "{S}",
        ],
        &[
            "spindle",
            "router",
            "--redis",
            "a=redis://127.0.0.1:6379",
            "--director-token",
            "{S}",
            "--consul-token",
            "{S}",
        ],
        &[
            "spindle",
            "dashboard",
            "--jobdb",
            "mysql://app:{S}@db:3306/jobdb_1",
        ],
        &[
            "spindle",
            "replay",
            "--from-jobdb",
            "mysql://app:{S}@db/jobdb_1",
            "--token",
            "{S}",
        ],
        &[
            "spindle",
            "jobdbs",
            "add",
            "--jobdb",
            "mysql://app:{S}@db/jobdb_1",
            "--consul-token",
            "{S}",
        ],
        &["spindle", "endpoints", "health", "--token", "{S}"],
        &[
            "spindle",
            "jobs",
            "show",
            "01J0000000000000000000000",
            "--token",
            "{S}",
        ],
        &[
            "spindle",
            "submit",
            "--token",
            "{S}",
            "--bucket",
            "b",
            "--endpoint",
            "http://e.test/",
        ],
        &["spindle", "bench", "--mysql", "mysql://app:{S}@db:3306"],
        &["spindle", "demo", "--jobdb", "mysql://app:{S}@db:3306/demo"],
    ];
    for line in lines {
        let cli = parse(line);
        let shown = format!("{cli:?}");
        assert!(!shown.contains(SECRET), "{line:?} shows a secret: {shown}");
        match &cli.command {
            Command::Director(args) => {
                let config = args.to_config().expect("director config");
                let shown = format!("{config:?} {:?}", config.jobdb);
                assert!(!shown.contains(SECRET), "director config: {shown}");
            }
            Command::Manager(args) => {
                let shown = format!("{:?}", args.to_config().expect("manager config"));
                assert!(!shown.contains(SECRET), "manager config: {shown}");
            }
            Command::Drainer(args) => {
                let shown = format!("{:?}", args.to_config().expect("drainer config"));
                assert!(!shown.contains(SECRET), "drainer config: {shown}");
            }
            _ => {}
        }
    }
}

#[tokio::test]
async fn jobdb_passwords_stay_out_of_the_inventory_and_come_from_the_readers_config() {
    let c = ConsulUnderTest::start().await;
    let name = format!(
        "secret_{}",
        &ulid::Ulid::new().to_string().to_lowercase()[..12]
    );
    let writer = Inventory::new(c.client.clone());
    let record = JobDbRecord {
        name: name.clone(),
        url: format!("mysql://app:{SECRET}@db.internal:3306/{name}"),
        state: JobDbState::Spare,
        changed_at: Utc::now(),
        changed_by: "test".into(),
    };
    assert!(writer.add(&record).await.expect("add"));
    let stored = c
        .client
        .kv_get(
            &format!("{}{name}", spindle::registry::inventory::RECORDS),
            Default::default(),
        )
        .await
        .expect("read kv")
        .value
        .expect("the record");
    let text = String::from_utf8_lossy(&stored.value).into_owned();
    assert!(!text.contains(SECRET), "consul kv holds a password: {text}");
    assert!(
        text.contains(&format!("mysql://app@db.internal:3306/{name}")),
        "{text}"
    );

    // A reader configured with the password connects with it; its Debug still hides it.
    let reader = Inventory::new(
        c.client
            .clone()
            .with_jobdb_password(Some(Secret::new(SECRET))),
    );
    let listed = reader.get(&name).await.expect("get").expect("listed");
    let url = reader.jobdb_url(&listed.record).expect("url");
    let options = url.mysql_options().expect("mysql");
    assert_eq!(options.get_username(), "app");
    let shown = format!(
        "{url:?} {listed:?} {:?}",
        reader.connect_url(&listed.record)
    );
    assert!(!shown.contains(SECRET), "{shown}");
    assert_eq!(
        reader.connect_url(&listed.record).expose(),
        format!("mysql://app:{SECRET}@db.internal:3306/{name}")
    );
    // Without one it connects as the URL says (a socket or trust setup needs none).
    let bare = writer.jobdb_url(&listed.record).expect("url");
    assert_eq!(bare.mysql_options().expect("mysql").get_username(), "app");
    let _ = c
        .client
        .kv_delete(
            &format!("{}{name}", spindle::registry::inventory::RECORDS),
            None,
        )
        .await;
    c.stop().await;
}

/// Every environment variable that may hold a secret: a password in a URL (JobDBs, MySQL
/// servers, Redis stores, the dashboard's JobDB list, and addresses that could carry user
/// information), a token, an S3 secret key.
const SECRET_ENV: &[&str] = &[
    "SPINDLE_JOBDB",
    "SPINDLE_DASHBOARD_JOBDBS",
    "SPINDLE_MANAGER_MYSQL",
    "SPINDLE_ROUTER_REDIS",
    "SPINDLE_BENCH_MYSQL",
    "SPINDLE_DEMO_JOBDB",
    "SPINDLE_JOBDB_PASSWORD",
    "SPINDLE_IMPORT_TOKEN",
    "SPINDLE_DIRECTOR_TOKEN",
    "SPINDLE_TOKEN",
    "SPINDLE_API",
    "SPINDLE_S3_ENDPOINT",
    "SPINDLE_S3_SECRET_ACCESS_KEY",
    "CONSUL_HTTP_ADDR",
    "CONSUL_HTTP_TOKEN",
];

/// The path of every command and subcommand, `[]` being `spindle` itself.
fn command_paths(command: &clap::Command, path: Vec<String>, out: &mut Vec<Vec<String>>) {
    out.push(path.clone());
    for sub in command.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        let mut deeper = path.clone();
        deeper.push(sub.get_name().to_owned());
        command_paths(sub, deeper, out);
    }
}

/// `--help` prints the environment variable each option reads, and clap shows its value too
/// unless told not to: a password in `SPINDLE_JOBDB` would reach a terminal, a screen share or
/// a support ticket. Every command's help, with every secret variable set, shows none of them.
#[test]
fn help_never_prints_the_value_of_a_secret_environment_variable() {
    use clap::CommandFactory;
    let tree = Cli::command();
    // The list names variables the command line really reads (so it cannot go stale quietly).
    let mut read = std::collections::HashSet::new();
    fn envs(command: &clap::Command, read: &mut std::collections::HashSet<String>) {
        for arg in command.get_arguments() {
            if let Some(env) = arg.get_env() {
                read.insert(env.to_string_lossy().into_owned());
            }
        }
        for sub in command.get_subcommands() {
            envs(sub, read);
        }
    }
    envs(&tree, &mut read);
    for env in SECRET_ENV {
        assert!(read.contains(*env), "no option reads {env}");
    }
    let mut paths = Vec::new();
    command_paths(&tree, Vec::new(), &mut paths);
    assert!(paths.len() > 20, "{paths:?}");
    let marker = |env: &str| format!("{SECRET}{}", env.to_lowercase());
    let mut shown_envs = 0;
    for path in &paths {
        let mut run = std::process::Command::new(env!("CARGO_BIN_EXE_spindle"));
        run.args(path).arg("--help");
        for env in SECRET_ENV {
            // A value each option accepts, so clap renders it as it would a real one.
            let value = match *env {
                "SPINDLE_ROUTER_REDIS" => format!("a=redis://u:{}@h:6379", marker(env)),
                e if e.contains("TOKEN") || e.contains("PASSWORD") || e.contains("SECRET") => {
                    marker(env)
                }
                _ => format!("mysql://u:{}@h:3306/d", marker(env)),
            };
            run.env(env, value);
        }
        let out = run.output().expect("run spindle --help");
        assert!(out.status.success(), "{path:?}: {out:?}");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        for env in SECRET_ENV {
            assert!(
                !text.contains(&marker(env)),
                "`spindle {} --help` prints the value of {env}:\n{text}",
                path.join(" ")
            );
            if text.contains(&format!("env: {env}")) {
                shown_envs += 1;
            }
        }
    }
    // The variables are still named (only their values are hidden).
    assert!(shown_envs >= SECRET_ENV.len(), "{shown_envs}");
}
