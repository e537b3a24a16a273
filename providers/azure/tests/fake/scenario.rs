//! A provider wired to the fakes (workload identity or a client secret), and the
//! checks that none of the scenario's secrets reached a text; shared by the test
//! binaries that use the fakes.

use std::sync::Arc;
use std::time::Duration;

use regbroker_azure::{AzureProvider, Env};
use regbroker_provider::{Credential, Error, ManualClock, Provider, Registry, SharedClock};

use super::*;

pub fn registry() -> Registry {
    Registry::parse(REGISTRY).unwrap()
}

pub struct Scenario {
    pub running: Running,
    pub _token_file: SaTokenFile,
    pub provider: AzureProvider,
    pub clock: ManualClock,
}

/// A provider wired to the fakes with workload identity (or a client secret).
pub async fn scenario(secret_instead_of_token_file: bool) -> Scenario {
    let running = start().await;
    let token_file = SaTokenFile::write();
    let mut env = identity_env(format!("{}/", running.https));
    env.push(("REGBROKER_AZURE_EXCHANGE_URL", running.exchange_url()));
    if secret_instead_of_token_file {
        env.push(("AZURE_CLIENT_SECRET", CLIENT_SECRET.to_string()));
    } else {
        env.push(("AZURE_FEDERATED_TOKEN_FILE", token_file.path.clone()));
    }
    let clock = ManualClock::fixed();
    let provider = AzureProvider::builder()
        .env(Env::from_pairs(env))
        .http_client(client_trusting(&running.ca_pem))
        .clock(Arc::new(clock.clone()) as SharedClock)
        .retry(2, Duration::from_millis(20))
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    Scenario {
        running,
        _token_file: token_file,
        provider,
        clock,
    }
}

pub async fn fetch(s: &Scenario) -> Result<Credential, Error> {
    let target = s.provider.recognise(&registry()).expect("recognised");
    s.provider.fetch(&target).await
}

pub fn secrets(s: &Scenario) -> Vec<String> {
    vec![
        s.running.fake.access_token.clone(),
        s.running.fake.refresh_token(),
        SA_TOKEN.to_string(),
        CLIENT_SECRET.to_string(),
    ]
}

pub fn assert_no_secret(s: &Scenario, text: &str) {
    for secret in secrets(s) {
        assert!(!text.contains(&secret), "a secret leaked into: {text}");
    }
}

pub fn assert_no_secret_in_error(s: &Scenario, e: &Error) {
    assert_no_secret(s, e.message());
    assert_no_secret(s, &e.chain());
    assert_no_secret(s, &format!("{e:?}"));
    assert!(!e.message().contains('\n'), "one line: {e}");
}
