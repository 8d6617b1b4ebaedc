//! Galera: claims and state checks that do not see another node's locks,
//! certification at commit.

use idem_model::check::{prove_model, refute_model};
use idem_model::galera::{AT_MOST_ONCE, CLAIMS_COUNTED, GaleraConfig, GaleraMutation};

#[test]
fn certification_keeps_claims_counted_and_effects_once() {
    prove_model("galera, 3 nodes, 3 claims", GaleraConfig::new(3));
}

#[test]
fn without_certification_a_claim_is_lost() {
    refute_model(
        "galera without certification",
        GaleraConfig {
            mutation: Some(GaleraMutation::NoCertification),
            ..GaleraConfig::new(2)
        },
        CLAIMS_COUNTED,
    );
}

#[test]
fn without_certification_two_nodes_both_act() {
    refute_model(
        "galera without certification",
        GaleraConfig {
            mutation: Some(GaleraMutation::NoCertification),
            ..GaleraConfig::new(2)
        },
        AT_MOST_ONCE,
    );
}
