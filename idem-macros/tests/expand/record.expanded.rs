//! Expansion snapshot input: `strategy = record`.
async fn send_notice(
    __idem_source: impl ::core::convert::Into<
        ::idem_runtime::__private::Source<'_, Sqlite>,
    >,
    n: &Notice,
) -> ::core::result::Result<
    ::idem_runtime::__private::Outcome<Receipt>,
    ::idem_runtime::__private::Error,
> {
    let __idem_span = ::idem_runtime::__private::span("send_notice", "record");
    let __idem_outer_span = ::core::clone::Clone::clone(&__idem_span);
    ::idem_runtime::__private::Instrument::instrument(
            async move {
                let __idem_key = ::idem_runtime::__private::reject_invalid(
                    &__idem_span,
                    ::idem_runtime::__private::KeyBuilder::new()
                        .lit("notice:")
                        .part("n.msg_id", &n.msg_id)
                        .finish(::core::option::Option::None),
                )?;
                let __idem_spec = ::idem_runtime::__private::Record {
                    biz_type: "notice",
                    biz_no: ::core::option::Option::Some(
                        ::idem_runtime::__private::key_part(&n.user_id),
                    ),
                    ttl_secs: 604800i64,
                    fingerprint: ::idem_runtime::__private::fingerprint(
                        &(&n.user_id, &n.text),
                    )?,
                };
                let mut __idem_call = match ::idem_runtime::__private::Call::<
                    Sqlite,
                >::open(
                        ::core::convert::Into::into(__idem_source),
                        __idem_key,
                        &__idem_spec,
                        __idem_span,
                    )
                    .await?
                {
                    ::idem_runtime::__private::Open::Run(__idem_call) => __idem_call,
                    ::idem_runtime::__private::Open::Done(__idem_outcome) => {
                        return ::core::result::Result::Ok(__idem_outcome);
                    }
                };
                let __idem_body: Result<Receipt, sqlx::Error> = {
                    let tx: &mut Transaction<'_, Sqlite> = __idem_call.tx();
                    async move {
                        sqlx::query("INSERT INTO sent (user_id, text) VALUES (?, ?)")
                            .bind(n.user_id)
                            .bind(&n.text)
                            .execute(&mut **tx)
                            .await?;
                        Ok(Receipt { channel: "sms".into() })
                    }
                        .await
                };
                __idem_call.finish(&__idem_spec, __idem_body).await
            },
            __idem_outer_span,
        )
        .await
}
