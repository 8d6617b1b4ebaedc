//! The demo's keys, both halves: the platforms' signing keys (the
//! simulated platforms use them) and what the merchant holds to check them
//! (the presets, [`Merchant::demo`](super::Merchant::demo)).
//!
//! **Demo keys only.** The RSA pairs are files of this repository
//! (`src/payments/keys/`, see its README), their private halves public:
//! a debug build would take seconds to generate 2048-bit keys at every
//! run. A real merchant holds only the public halves, from the platforms'
//! consoles, and its secrets (Stripe's `whsec_…`, WeChat Pay's APIv3 key)
//! in its secret store, never in code.

/// Stripe's endpoint secret before the roll.
pub const STRIPE_SECRET: &str = "whsec_demo_current_0123456789abcdef";
/// Stripe's endpoint secret after the roll: during the roll Stripe signs
/// with both, one `v1` each.
pub const STRIPE_NEXT_SECRET: &str = "whsec_demo_next_fedcba9876543210";

/// The simulated Alipay's signing key (PKCS#8 PEM). Demo only.
pub const ALIPAY_PRIVATE_PEM: &str = include_str!("keys/alipay.pem");
/// The Alipay public key the merchant checks with. Demo only.
pub const ALIPAY_PUBLIC_PEM: &str = include_str!("keys/alipay.pub.pem");
/// The merchant's Alipay application (`app_id` in every notification).
pub const ALIPAY_APP_ID: &str = "2021000000000042";

/// WeChat Pay's platform keys during a rotation: the name
/// `Wechatpay-Serial` carries, the private half (the simulated platform's)
/// and the public half (the merchant's). Demo only.
pub const WECHATPAY_KEYS: [(&str, &str, &str); 2] = [
    (
        "PUB_KEY_ID_DEMO_1",
        include_str!("keys/wechatpay-1.pem"),
        include_str!("keys/wechatpay-1.pub.pem"),
    ),
    (
        "PUB_KEY_ID_DEMO_2",
        include_str!("keys/wechatpay-2.pem"),
        include_str!("keys/wechatpay-2.pub.pem"),
    ),
];
/// The merchant's APIv3 key (32 bytes): WeChat Pay encrypts each
/// notification's `resource` under it. Demo only.
pub const WECHATPAY_APIV3_KEY: &[u8; 32] = b"demo-apiv3-key-of-32-bytes-only!";
/// The merchant's WeChat Pay merchant id (`mchid` in every resource).
pub const WECHATPAY_MCHID: &str = "1900000042";

/// An RSA signing key (SHA256withRSA, PKCS#1 v1.5) from a PKCS#8 PEM.
pub type RsaSigner = rsa::pkcs1v15::SigningKey<sha2::Sha256>;

/// A PKCS#8 PEM's signing key; panics on a PEM that is not one (the demo
/// keys are).
pub fn rsa_signer(pem: &str) -> RsaSigner {
    use rsa::pkcs8::DecodePrivateKey as _;
    let key = rsa::PrivateKey::from_pkcs8_pem(pem).expect("a PKCS#8 RSA private key");
    RsaSigner::new(key)
}
