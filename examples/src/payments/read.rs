//! Each platform's verified payload read as a [`Payment`]: the fields that
//! platform documents, and the checks a merchant owes them (a success, of
//! this merchant, in CNY, for one of its orders).

use super::keys::{ALIPAY_APP_ID, WECHATPAY_MCHID};
use super::protocol::{ALIPAY, Payment, Rejection, STRIPE, WECHATPAY, shown};
use idem_runtime::http::scheme::Alipay;
use serde_json::Value;

/// The merchant's order number (`metadata.order_id`, `client_reference_id`,
/// `out_trade_no`): the order's id in decimal.
fn order_id(text: &str) -> Result<i64, Rejection> {
    let ok = !text.is_empty() && text.len() <= 18 && text.bytes().all(|b| b.is_ascii_digit());
    ok.then(|| text.parse().ok())
        .flatten()
        .ok_or_else(|| Rejection::bad_request(format!("`{}` is not an order number", shown(text))))
}

fn cny(currency: &str) -> Result<(), Rejection> {
    if currency.eq_ignore_ascii_case("cny") {
        return Ok(());
    }
    let why = format!(
        "paid in `{}`; the orders are priced in CNY",
        shown(currency)
    );
    Err(Rejection::unprocessable("AMOUNT_MISMATCH", why))
}

fn unsupported(what: &str, value: &str) -> Rejection {
    let why = format!("{what} `{}` is not a payment", shown(value));
    Rejection::unprocessable("UNSUPPORTED_STATUS", why)
}

fn field<'a>(v: &'a Value, path: &[&str]) -> Result<&'a Value, Rejection> {
    path.iter()
        .try_fold(v, |v, name| v.get(name))
        .ok_or_else(|| Rejection::bad_request(format!("no `{}`", path.join("."))))
}

fn text<'a>(v: &'a Value, path: &[&str]) -> Result<&'a str, Rejection> {
    field(v, path)?
        .as_str()
        .ok_or_else(|| Rejection::bad_request(format!("`{}` is not a string", path.join("."))))
}

fn cents(v: &Value, path: &[&str]) -> Result<i64, Rejection> {
    field(v, path)?.as_i64().filter(|c| *c > 0).ok_or_else(|| {
        Rejection::bad_request(format!("`{}` is not a positive integer", path.join(".")))
    })
}

/// Stripe's event (`SignedCallback<Stripe>`'s payload), `serial` its `id`:
/// `payment_intent.succeeded` (the intent's `amount_received`, the order in
/// `metadata.order_id`) or `checkout.session.completed` (`amount_total`,
/// `payment_status` `paid`, the order in `client_reference_id`).
pub fn stripe_payment(serial: &str, payload: &[u8]) -> Result<Payment, Rejection> {
    let event: Value = serde_json::from_slice(payload)
        .map_err(|e| Rejection::bad_request(format!("not a Stripe event: {e}")))?;
    let object = field(&event, &["data", "object"])?;
    let (order, amount) = match text(&event, &["type"])? {
        "payment_intent.succeeded" => {
            let status = text(object, &["status"])?;
            if status != "succeeded" {
                return Err(unsupported("payment intent status", status));
            }
            (
                text(object, &["metadata", "order_id"])?,
                cents(object, &["amount_received"])?,
            )
        }
        "checkout.session.completed" => {
            let status = text(object, &["payment_status"])?;
            if status != "paid" {
                return Err(unsupported("checkout session payment_status", status));
            }
            (
                text(object, &["client_reference_id"])?,
                cents(object, &["amount_total"])?,
            )
        }
        other => return Err(unsupported("event type", other)),
    };
    cny(text(object, &["currency"])?)?;
    Ok(Payment {
        platform: STRIPE.into(),
        serial: serial.into(),
        order_id: order_id(order)?,
        amount_cents: amount,
    })
}

/// An amount in yuan as Alipay writes it (`19.99`, `20`, `0.5`) in fen,
/// exactly: no float on the way.
pub fn yuan_to_cents(text: &str) -> Option<i64> {
    let (whole, frac) = match text.split_once('.') {
        Some((_, "")) => return None,
        Some(parts) => parts,
        None => (text, ""),
    };
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || whole.len() > 12 || frac.len() > 2 || !digits(whole) || !digits(frac) {
        return None;
    }
    let frac: i64 = format!("{frac:0<2}").parse().ok()?;
    Some(whole.parse::<i64>().ok()? * 100 + frac)
}

/// Alipay's asynchronous notification (`SignedCallback<Alipay>`'s payload,
/// the form as signed), `serial` its `trade_no`: `trade_status`
/// `TRADE_SUCCESS`, this merchant's `app_id`, the order in `out_trade_no`,
/// `total_amount` in yuan.
pub fn alipay_payment(serial: &str, payload: &[u8]) -> Result<Payment, Rejection> {
    let form = Alipay::parse_form(payload).map_err(|e| Rejection::bad_request(e.to_string()))?;
    let get = |name: &str| {
        let found = form
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str());
        found.ok_or_else(|| Rejection::bad_request(format!("the form has no `{name}`")))
    };
    let status = get("trade_status")?;
    if status != "TRADE_SUCCESS" {
        return Err(unsupported("trade_status", status));
    }
    let app = get("app_id")?;
    if app != ALIPAY_APP_ID {
        let why = format!("app_id `{}` is another merchant's", shown(app));
        return Err(Rejection::unprocessable("OTHER_MERCHANT", why));
    }
    let total = get("total_amount")?;
    let amount = yuan_to_cents(total).filter(|c| *c > 0).ok_or_else(|| {
        Rejection::bad_request(format!("total_amount `{}` is not an amount", shown(total)))
    })?;
    Ok(Payment {
        platform: ALIPAY.into(),
        serial: serial.into(),
        order_id: order_id(get("out_trade_no")?)?,
        amount_cents: amount,
    })
}

/// WeChat Pay's decrypted `resource` (`SignedCallback<WeChatPay>`'s
/// payload), `serial` its `transaction_id`: `trade_state` `SUCCESS`, this
/// merchant's `mchid`, the order in `out_trade_no`, `amount.total` in fen.
pub fn wechatpay_payment(serial: &str, payload: &[u8]) -> Result<Payment, Rejection> {
    let resource: Value = serde_json::from_slice(payload)
        .map_err(|e| Rejection::bad_request(format!("not a WeChat Pay resource: {e}")))?;
    let state = text(&resource, &["trade_state"])?;
    if state != "SUCCESS" {
        return Err(unsupported("trade_state", state));
    }
    let mchid = text(&resource, &["mchid"])?;
    if mchid != WECHATPAY_MCHID {
        let why = format!("mchid `{}` is another merchant's", shown(mchid));
        return Err(Rejection::unprocessable("OTHER_MERCHANT", why));
    }
    cny(text(&resource, &["amount", "currency"])?)?;
    Ok(Payment {
        platform: WECHATPAY.into(),
        serial: serial.into(),
        order_id: order_id(text(&resource, &["out_trade_no"])?)?,
        amount_cents: cents(&resource, &["amount", "total"])?,
    })
}
