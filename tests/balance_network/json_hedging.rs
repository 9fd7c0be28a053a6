//! A hedging policy from service-config JSON over tonic's own `Channel::balance_list`, with
//! one backend of three always `UNAVAILABLE`: A6 sends the next hedge at once after each
//! failure, and the JSON policy's hedge budget, which governs backups only, does not stop it.

use super::*;

use tower_retry_hedge::ServiceConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_hedging_over_tonics_balancer_survives_a_dead_backend() {
    let servers = [
        EchoPeer::spawn(Behaviour::Unavailable).await,
        EchoPeer::spawn(Behaviour::Ok).await,
        EchoPeer::spawn(Behaviour::Ok).await,
    ];
    // No throttle; `maxAttempts` 5 (the client's cap). tonic's balancer does not know what a
    // call tried, so a call fails only if all 5 attempts draw the dead backend (about 1 in
    // 250 with an even draw). The hedging delay is far past any call's time on the real
    // clock, even on busy cores: only the hedges after failures go.
    let policies = ServiceConfig::from_json(
        r#"{"methodConfig": [{
            "name": [{"service": "test.echo.Echo"}],
            "hedgingPolicy": {
                "maxAttempts": 5, "hedgingDelay": "5s", "nonFatalStatusCodes": ["UNAVAILABLE"]
            }
        }]}"#,
    )
    .expect("valid service config")
    .policies();
    let channel = Channel::balance_list(servers.each_ref().map(EchoPeer::endpoint).into_iter());
    let client = EchoClient::new(HedgeLayer::new(policies.clone()).layer(channel));
    let calls = 100;
    let outcomes = guard(run(client, 0, calls, 1)).await;

    let dead = servers[0].attempts(0..calls);
    println!(
        "{calls} calls of a JSON hedging method over Channel::balance_list, 1 of 3 backends \
         UNAVAILABLE: {} failed, {dead} attempts reached the dead backend",
        failures(&outcomes),
    );
    assert!(failures(&outcomes) <= 3, "{} failed", failures(&outcomes));
    // The dead backend took its share, so the hedges after failures were needed.
    assert!(dead >= 10, "the dead backend saw {dead} attempts");
    let snapshot = policies.stats().snapshot();
    let over = snapshot
        .methods
        .values()
        .map(|m| m.hedges_over_budget)
        .sum::<u64>();
    assert_eq!(over, 0, "no backup was due, so none was over budget");

    for server in servers {
        server.shutdown().await;
    }
}
