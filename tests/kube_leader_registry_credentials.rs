//! Leader failover of the `RegistryCredential` controller (issue 24): replicas of the real
//! binary, `regbroker serve --registry-credentials --leader-elect` (no `--sync-secret`),
//! against a real kube-apiserver (tests/control_plane) with moto issuing twelve-hour ECR
//! tokens (`flux_support::Ecr`). Every
//! replica acts as the ServiceAccount that `deploy/` ships, with the RBAC it ships
//! (`deploy/standalone/rbac.yaml`: the Lease; `deploy/registry-credentials/rbac.yaml`: the
//! controller), and reaches the API server through a TCP proxy of its own that connects
//! from a loopback address of its own (`127.0.0.N`).
//!
//! Who wrote what is read from the API server's audit log of write requests
//! ([`ControlPlane::shared_with_audit`]): the replicas share one ServiceAccount, but each
//! one's requests carry its proxy's source address. What the objects say of their writer
//! is checked too: the `regbroker/written-by` annotation of each Secret and the
//! `reportingInstance` of each Event are the Lease holder's identity.
//!
//! The scenario, in one control plane: two replicas start, one leads and reconciles while
//! the other writes nothing; the leader is SIGKILLed and the other takes the Lease within
//! the lease duration plus a margin, makes an object created after the kill Ready and
//! restores a deleted Secret; a third replica joins, the leader gets SIGTERM, releases the
//! Lease, and the third takes over within about a retry period. Over the whole run the
//! audit log shows one writer at a time. Waits are polls with bounded deadlines.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(feature = "aws")]

mod common;
mod control_plane;
mod flux_support;
mod registry_peer;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, SystemTime};

use common::ServeProcess;
use control_plane::{Audited, ControlPlane};
use flux_support::Ecr;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, PostParams};
use regbroker::controller::api::{RegistryCredential, RegistryCredentialSpec};
use regbroker_provider::{Clock as _, SystemClock};
use registry_peer::closed_port;
use rustix::process::Signal;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::time::Instant;

const LEASE: &str = "regbroker";
const HOST: &str = "555555555555.dkr.ecr.us-east-1.amazonaws.com";
const ROLE: &str = "arn:aws:iam::111111111111:role/team-a-puller";
/// The password moto's ECR hands the role's account.
const PASSWORD: &str = "111111111111-auth-token";
const AUTHOR: &str = "regbroker/written-by";
/// Short timings in client-go's proportions (15/10/2 s by default), with a lease long
/// enough that a takeover after SIGTERM (about one retry period, the Lease released) and
/// one without a release (a lease duration at least) are seconds apart.
const LEASE_DURATION: Duration = Duration::from_secs(6);
const RENEW_DEADLINE: Duration = Duration::from_secs(4);
const RETRY_PERIOD: Duration = Duration::from_millis(500);
/// client-go's JitterFactor: a candidate retries after 1 to 2.2 retry periods.
const JITTER: f64 = 1.2;
/// Slack for a loaded 2-core machine on top of each bound.
const TOLERANCE: Duration = Duration::from_millis(1500);
/// From a leader's first term to an object it had not seen being Ready: its watches
/// listed, a TokenRequest, STS and ECR on moto, the Secret and the status written.
const RECONCILE: Duration = Duration::from_secs(10);

/// The worst case after SIGKILL: a follower saw the last renewal up to one jittered retry
/// after it, counts a lease duration from there, and tries again up to one jittered retry
/// later.
fn kill_bound() -> Duration {
    LEASE_DURATION + RETRY_PERIOD.mul_f64(2.0 * (1.0 + JITTER)) + TOLERANCE
}

/// After SIGTERM the Lease is released: the follower's next retry takes it. Without the
/// release it could not before a lease duration less one retry period.
fn term_bound() -> Duration {
    RETRY_PERIOD.mul_f64(1.0 + JITTER) + TOLERANCE
}

fn now_wall() -> SystemTime {
    SystemClock.now()
}

/// A TCP proxy in front of the API server whose upstream connections come from
/// `source`, so the audit log tells its replica's requests apart.
struct Proxy {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: SocketAddr, source: Ipv4Addr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(Proxy::carry(client, upstream, source));
            }
        });
        Proxy { addr, task }
    }

    async fn carry(mut client: TcpStream, upstream: SocketAddr, source: Ipv4Addr) {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(source.into(), 0)).unwrap();
        if let Ok(mut server) = socket.connect(upstream).await {
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One `regbroker serve --registry-credentials --leader-elect` process.
struct Replica {
    name: String,
    /// The address its API requests come from.
    source: String,
    process: ServeProcess,
    _proxy: Proxy,
}

impl Replica {
    /// Its holder identity is `NAME_<suffix>`.
    fn is(&self, identity: &str) -> bool {
        identity
            .strip_prefix(&self.name)
            .is_some_and(|rest| rest.starts_with('_'))
    }

    async fn get(&self, path: &str) -> (u16, String) {
        let res = reqwest::Client::new()
            .get(format!("http://{}{path}", self.process.addr))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .unwrap();
        (res.status().as_u16(), res.text().await.unwrap())
    }

    /// `regbroker_leader` from its /metrics.
    async fn leader_gauge(&self) -> i64 {
        let (_, text) = self.get("/metrics").await;
        text.lines()
            .find_map(|l| l.strip_prefix("regbroker_leader "))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    fn signal(&self, signal: Signal) {
        let pid = rustix::process::Pid::from_raw(self.process.child.id() as i32).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
    }

    /// Waits (bounded) for the process to exit after a signal; its exit status.
    fn reap(&mut self) -> std::process::ExitStatus {
        common::wait_exit(&mut self.process.child, Duration::from_secs(15))
            .unwrap_or_else(|| panic!("{} did not exit within 15 s", self.name))
    }

    /// Its write requests in the audit log.
    fn writes(&self, all: &[Audited]) -> Vec<Audited> {
        all.iter()
            .filter(|w| w.source == self.source && w.is_write())
            .cloned()
            .collect()
    }
}

/// A request about the Lease (the only one the replicas may touch; a refused request
/// may name none).
fn is_lease(w: &Audited) -> bool {
    w.resource == "leases"
}

/// The replica's first successful Lease write (how it became leader), and its other
/// writes.
fn term(writes: &[Audited]) -> (Option<Audited>, Vec<Audited>) {
    let acquired = writes
        .iter()
        .find(|w| is_lease(w) && w.succeeded())
        .cloned();
    let others = writes.iter().filter(|w| !is_lease(w)).cloned().collect();
    (acquired, others)
}

/// The CRD and the deployed RBAC, for ServiceAccount `OPERATOR/regbroker`, applied once per
/// test binary (the ClusterRoleBinding is cluster-wide); returns OPERATOR.
async fn operator(cp: &ControlPlane) -> String {
    static NS: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    NS.get_or_init(|| async {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
        let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
        cp.apply(&read("registry-credentials/crd.yaml"));
        let (ok, out, err) = cp.kubectl(
            &[
                "wait",
                "--for=condition=Established",
                "crd/registrycredentials.regbroker.dev",
                "--timeout=60s",
            ],
            "",
        );
        assert!(ok, "{out}{err}");
        let ns = cp.namespace("rc-regbroker").await;
        let apps = cp.namespace("rc-apps").await;
        // The standalone Deployment's RBAC (the Lease, and its Secret sync's Role, unused
        // here) and the controller's, as kubectl apply -k deploy/registry-credentials does.
        let standalone = read("standalone/rbac.yaml");
        assert!(standalone.contains(&format!("resourceNames: [\"{LEASE}\"]")));
        cp.apply(
            &standalone
                .replace("namespace: apps", &format!("namespace: {apps}"))
                .replace("namespace: regbroker", &format!("namespace: {ns}")),
        );
        let controller = read("registry-credentials/rbac.yaml");
        assert!(controller.contains("namespace: regbroker"));
        cp.apply(&controller.replace("namespace: regbroker", &format!("namespace: {ns}")));
        ns
    })
    .await
    .clone()
}

/// Everything the replicas of the test share.
struct Cluster {
    cp: &'static ControlPlane,
    /// regbroker's namespace: its ServiceAccount and the Lease.
    operator: String,
    /// The tenant's namespace: its ServiceAccount `puller` and the objects.
    tenant: String,
    kubeconfig: serde_json::Value,
    moto: Ecr,
    upstream: SocketAddr,
    next: u8,
    dir: tempfile::TempDir,
}

impl Cluster {
    async fn new() -> Cluster {
        let cp = ControlPlane::shared_with_audit();
        let operator = operator(cp).await;
        let tenant = cp.namespace("rc-team-a").await;
        let puller = ServiceAccount {
            metadata: ObjectMeta {
                name: Some("puller".into()),
                annotations: Some([("eks.amazonaws.com/role-arn".into(), ROLE.into())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<ServiceAccount>::namespaced(cp.admin(), &tenant)
            .create(&PostParams::default(), &puller)
            .await
            .unwrap();
        let path = cp.service_account_kubeconfig(&operator, "regbroker").await;
        let kubeconfig = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let upstream = cp.server.strip_prefix("https://").unwrap().parse().unwrap();
        Cluster {
            cp,
            operator,
            tenant,
            kubeconfig,
            moto: Ecr::start(),
            upstream,
            next: 0,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// Starts replica `replica-N`, its API requests from 127.0.0.(10 + N).
    async fn replica(&mut self) -> Replica {
        let n = self.next;
        self.next += 1;
        let name = format!("replica-{n}");
        let source = Ipv4Addr::new(127, 0, 0, 10 + n);
        let proxy = Proxy::start(self.upstream, source).await;
        let mut kubeconfig = self.kubeconfig.clone();
        kubeconfig["clusters"][0]["cluster"]["server"] = format!("https://{}", proxy.addr).into();
        let path = self.dir.path().join(format!("{name}.kubeconfig"));
        std::fs::write(&path, kubeconfig.to_string()).unwrap();
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        let args = [
            "--registry-credentials".to_string(),
            "--leader-elect".to_string(),
            format!("--leader-elect-namespace={}", self.operator),
            format!("--leader-elect-lease-duration={}", ms(LEASE_DURATION)),
            format!("--leader-elect-renew-deadline={}", ms(RENEW_DEADLINE)),
            format!("--leader-elect-retry-period={}", ms(RETRY_PERIOD)),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let home = self.dir.path().join(format!("{name}-home"));
        std::fs::create_dir_all(&home).unwrap();
        let moto = format!("http://{}", self.moto.addr);
        // No identity of its own: AWS goes to moto with IMDS off, GCP's metadata server
        // is a closed port.
        let metadata = format!("127.0.0.1:{}", closed_port());
        let env = [
            ("KUBECONFIG", path.to_str().unwrap()),
            ("POD_NAME", name.as_str()),
            ("HOME", home.to_str().unwrap()),
            ("AWS_ENDPOINT_URL", moto.as_str()),
            ("AWS_EC2_METADATA_DISABLED", "true"),
            ("AWS_REGION", "us-east-1"),
            ("GCE_METADATA_HOST", metadata.as_str()),
            ("REGBROKER_LOG", "info"),
        ];
        let process = tokio::task::block_in_place(|| ServeProcess::start(&args, &env));
        Replica {
            name,
            source: source.to_string(),
            process,
            _proxy: proxy,
        }
    }

    /// Waits (bounded) until `replica` has read the Lease (a candidate's round: it saw
    /// the Lease held, as it wrote none).
    async fn wait_round(&self, replica: &Replica) {
        let since = Instant::now();
        while !self
            .cp
            .audited()
            .iter()
            .any(|r| r.source == replica.source && is_lease(r) && r.verb == "get" && r.succeeded())
        {
            assert!(
                since.elapsed() < Duration::from_secs(15),
                "{} did not read the Lease within 15 s",
                replica.name
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The Lease's holder now ("" once released).
    async fn holder(&self) -> String {
        Api::<Lease>::namespaced(self.cp.admin(), &self.operator)
            .get_opt(LEASE)
            .await
            .unwrap()
            .and_then(|l| l.spec?.holder_identity)
            .unwrap_or_default()
    }

    /// Waits (at most `limit`) until `replica` holds the Lease; how long that took from
    /// `since`.
    async fn wait_holder(&self, replica: &Replica, since: Instant, limit: Duration) -> Duration {
        loop {
            let holder = self.holder().await;
            if replica.is(&holder) {
                return since.elapsed();
            }
            assert!(
                since.elapsed() < limit,
                "{} did not take the Lease within {limit:?} (holder {holder:?})",
                replica.name
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Creates `RegistryCredential` `name` for [`HOST`] as ServiceAccount `puller`.
    async fn create(&self, name: &str) {
        let spec = RegistryCredentialSpec {
            registries: vec![HOST.to_string()],
            service_account_name: Some("puller".into()),
            secret_ref: None,
            target: None,
            suspend: false,
        };
        Api::<RegistryCredential>::namespaced(self.cp.admin(), &self.tenant)
            .create(&PostParams::default(), &RegistryCredential::new(name, spec))
            .await
            .unwrap();
    }

    /// Waits (at most `limit` from `since`) until object `name` is Ready and its Secret
    /// holds the tenant's credential; returns how long that took, and the Secret.
    async fn wait_ready(&self, name: &str, since: Instant, limit: Duration) -> (Duration, Secret) {
        let objects = Api::<RegistryCredential>::namespaced(self.cp.admin(), &self.tenant);
        loop {
            let o = objects.get(name).await.unwrap();
            let ready = o.status.as_ref().is_some_and(|s| {
                s.observed_generation == o.metadata.generation
                    && s.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
            });
            if ready && let Some(secret) = self.secret(name).await {
                assert_eq!(
                    password(&secret),
                    PASSWORD,
                    "{name}: the tenant's credential"
                );
                return (since.elapsed(), secret);
            }
            assert!(
                since.elapsed() < limit,
                "{name} not Ready within {limit:?}; status: {:?}",
                o.status
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn secret(&self, name: &str) -> Option<Secret> {
        Api::<Secret>::namespaced(self.cp.admin(), &self.tenant)
            .get_opt(name)
            .await
            .unwrap()
    }

    /// Deletes Secret `name` and waits (at most `limit`) until it is back; how long that
    /// took, and the new Secret.
    async fn delete_and_wait_restored(&self, name: &str, limit: Duration) -> (Duration, Secret) {
        let api = Api::<Secret>::namespaced(self.cp.admin(), &self.tenant);
        let old = api.get(name).await.unwrap().metadata.uid;
        let since = Instant::now();
        api.delete(name, &DeleteParams::default()).await.unwrap();
        loop {
            if let Some(s) = self.secret(name).await
                && s.metadata.uid != old
            {
                assert_eq!(
                    password(&s),
                    PASSWORD,
                    "{name}: restored with the credential"
                );
                return (since.elapsed(), s);
            }
            assert!(
                since.elapsed() < limit,
                "Secret {name} not restored within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The Events about object `name`: (reportingController, reportingInstance, reason).
    async fn events(&self, name: &str) -> Vec<(String, String, String)> {
        Api::<Event>::namespaced(self.cp.admin(), &self.tenant)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .map(|e| {
                (
                    e.reporting_controller.unwrap_or_default(),
                    e.reporting_instance.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                )
            })
            .collect()
    }

    /// Secret `name` was written by `leader`, as its annotation says.
    fn assert_written_by(&self, name: &str, secret: &Secret, leader: &str) {
        let author = secret
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(AUTHOR))
            .map(String::as_str);
        assert_eq!(author, Some(leader), "Secret {name}: its writer");
    }

    /// Object `name` was reconciled by `leader` alone, as its objects say: its Secret is
    /// signed by it, and it reported every Event about it (at least the one for Ready).
    async fn assert_reconciled_by(&self, name: &str, secret: &Secret, leader: &str) {
        self.assert_written_by(name, secret, leader);
        let events = self.events(name).await;
        assert!(
            events.iter().any(|(_, _, reason)| reason == "Succeeded"),
            "{name}: no Event for Ready: {events:?}"
        );
        for (controller, instance, reason) in &events {
            assert_eq!(controller, "regbroker", "{name}: Event {reason}");
            assert_eq!(
                instance, leader,
                "{name}: Event {reason} by another replica"
            );
        }
    }
}

fn password(secret: &Secret) -> String {
    use base64::Engine as _;
    let doc = &secret.data.as_ref().unwrap()[".dockerconfigjson"].0;
    let doc: serde_json::Value = serde_json::from_slice(doc).unwrap();
    let auth = doc["auths"][HOST]["auth"].as_str().unwrap();
    let pair = base64::engine::general_purpose::STANDARD
        .decode(auth)
        .unwrap();
    let pair = String::from_utf8(pair).unwrap();
    pair.split_once(':').unwrap().1.to_string()
}

/// What a replica wrote before `until`, other than refused Lease attempts (two candidates
/// may both try to create the Lease at start-up; one is refused).
fn wrote_before(writes: &[Audited], until: SystemTime) -> Vec<&Audited> {
    writes
        .iter()
        .filter(|w| w.received < until && (!is_lease(w) || w.succeeded()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs moto_server, etcd, kube-apiserver, kubectl from scripts/peers.sh; run scripts/test.sh"]
async fn one_replica_reconciles_and_the_survivor_of_sigkill_or_sigterm_carries_on() {
    let mut cluster = Cluster::new().await;
    let cp = cluster.cp;

    // 1. Two replicas start; one leads and reconciles, the other follows.
    let mut replicas = vec![cluster.replica().await, cluster.replica().await];
    let started = Instant::now();
    cluster.create("one").await;
    let (t, one) = cluster
        .wait_ready("one", started, Duration::from_secs(60))
        .await;
    eprintln!(
        "two replicas: object Ready {:.2} s after they started",
        t.as_secs_f64()
    );
    let leader_id = cluster.holder().await;
    let i = replicas
        .iter()
        .position(|r| r.is(&leader_id))
        .unwrap_or_else(|| panic!("no replica is the holder {leader_id:?}"));
    let mut leader = replicas.remove(i);
    let mut survivor = replicas.remove(0);
    cluster.assert_reconciled_by("one", &one, &leader_id).await;
    assert_eq!(leader.leader_gauge().await, 1, "{} leads", leader.name);
    assert_eq!(
        survivor.leader_gauge().await,
        0,
        "{} follows",
        survivor.name
    );
    for r in [&leader, &survivor] {
        assert_eq!(r.get("/readyz").await.0, 200, "{} is ready", r.name);
    }
    // While it leads, the leader alone does the work: a new object, a deleted Secret.
    let since = Instant::now();
    cluster.create("two").await;
    let (_, two) = cluster.wait_ready("two", since, RECONCILE).await;
    cluster.assert_reconciled_by("two", &two, &leader_id).await;
    let (t, one) = cluster.delete_and_wait_restored("one", RECONCILE).await;
    cluster.assert_written_by("one", &one, &leader_id);
    eprintln!(
        "leader: deleted Secret restored after {:.2} s",
        t.as_secs_f64()
    );
    assert!(
        leader_id == cluster.holder().await,
        "no takeover before the kill"
    );
    // So far, by the audit log: the follower wrote nothing, to any resource.
    let writes = survivor.writes(&cp.audited());
    let early = wrote_before(&writes, now_wall());
    assert!(
        early.is_empty(),
        "{} wrote while {} led: {early:#?}",
        survivor.name,
        leader.name
    );

    // 2. SIGKILL the leader: the other takes the Lease once it expires, makes an object
    // created after the kill Ready, and restores a deleted Secret.
    let killed_at = now_wall();
    let since = Instant::now();
    leader.signal(Signal::KILL);
    cluster.create("three").await;
    let took = cluster
        .wait_holder(&survivor, since, kill_bound() + Duration::from_secs(5))
        .await;
    assert!(
        took <= kill_bound(),
        "SIGKILL: {} took the Lease after {took:?}, more than {:?}",
        survivor.name,
        kill_bound()
    );
    let survivor_id = cluster.holder().await;
    let (ready, three) = cluster
        .wait_ready("three", since, kill_bound() + RECONCILE)
        .await;
    cluster
        .assert_reconciled_by("three", &three, &survivor_id)
        .await;
    let (restored, two) = cluster.delete_and_wait_restored("two", RECONCILE).await;
    cluster.assert_written_by("two", &two, &survivor_id);
    eprintln!(
        "leader SIGKILL: Lease taken after {:.2} s (bound {:.2} s), object created after the kill Ready after {:.2} s; deleted Secret restored by the new leader after {:.2} s",
        took.as_secs_f64(),
        kill_bound().as_secs_f64(),
        ready.as_secs_f64(),
        restored.as_secs_f64()
    );
    let status = leader.reap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );

    // 3. A third replica joins and follows; SIGTERM the leader: it releases the Lease and
    // the third takes over within about a retry period, far below the lease duration.
    let mut third = cluster.replica().await;
    cluster.wait_round(&third).await;
    assert_eq!(third.leader_gauge().await, 0, "{} follows", third.name);
    let termed_at = now_wall();
    let since = Instant::now();
    survivor.signal(Signal::TERM);
    let took_term = cluster
        .wait_holder(&third, since, kill_bound() + Duration::from_secs(5))
        .await;
    assert!(
        took_term <= term_bound(),
        "SIGTERM: {} took the Lease after {took_term:?}, more than {:?}: was it released?",
        third.name,
        term_bound()
    );
    let third_id = cluster.holder().await;
    let since = Instant::now();
    cluster.create("four").await;
    let (ready_term, four) = cluster.wait_ready("four", since, RECONCILE).await;
    cluster.assert_reconciled_by("four", &four, &third_id).await;
    assert!(survivor.reap().success(), "SIGTERM: a clean exit");
    eprintln!(
        "leader SIGTERM: Lease taken after {:.2} s (bound {:.2} s, lease duration {:.0} s); a new object Ready {:.2} s after its creation",
        took_term.as_secs_f64(),
        term_bound().as_secs_f64(),
        LEASE_DURATION.as_secs_f64(),
        ready_term.as_secs_f64()
    );

    // 4. The audit log, per replica: a follower never writes, and one replica writes at a
    // time. The first leader's writes show the log attributes them (non-vacuous).
    let all = cp.audited();
    let (first, first_writes) = term(&leader.writes(&all));
    let first = first.expect("the first leader wrote the Lease");
    assert!(first.received < killed_at);
    for (resource, subresource, verb) in [
        ("secrets", "", "create"),
        ("registrycredentials", "status", "patch"),
        ("events", "", "create"),
        ("serviceaccounts", "token", "create"),
    ] {
        assert!(
            first_writes.iter().any(|w| w.resource == resource
                && w.subresource == subresource
                && w.verb == verb
                && w.succeeded()),
            "the audit log shows no {verb} {resource}/{subresource} by the leader: {first_writes:#?}"
        );
    }
    assert!(first_writes.iter().all(|w| w.received > first.completed));
    // The follower, until the kill: nothing, to any resource.
    let second_all = survivor.writes(&all);
    let early = wrote_before(&second_all, killed_at);
    assert!(
        early.is_empty(),
        "{} wrote while {} led: {early:#?}",
        survivor.name,
        leader.name
    );
    // Its term: it took the Lease after the kill and wrote only after taking it.
    let (second, second_writes) = term(&second_all);
    let second = second.expect("the survivor took the Lease");
    assert!(second.received > killed_at);
    assert!(!second_writes.is_empty());
    for w in &second_writes {
        assert!(
            w.received > second.completed,
            "{} wrote before it held the Lease: {w:#?}",
            survivor.name
        );
    }
    // The third: nothing until SIGTERM; it took the Lease after the survivor's last
    // write, the release included, had been answered.
    let third_all = third.writes(&all);
    let early = wrote_before(&third_all, termed_at);
    assert!(
        early.is_empty(),
        "{} wrote while {} led: {early:#?}",
        third.name,
        survivor.name
    );
    let (taken, third_writes) = term(&third_all);
    let taken = taken.expect("the third took the Lease");
    let last = second_all.iter().map(|w| w.completed).max().unwrap();
    assert!(
        last < taken.received,
        "{} still wrote after {} had begun taking the Lease",
        survivor.name,
        third.name
    );
    assert!(!third_writes.is_empty());
    for w in &third_writes {
        assert!(w.received > taken.completed, "{w:#?}");
    }
    eprintln!(
        "audit log: {} writes by the first leader, {} by the second, {} by the third; none by a follower",
        first_writes.len(),
        second_writes.len(),
        third_writes.len()
    );
    third.signal(Signal::TERM);
    assert!(third.reap().success());
}
