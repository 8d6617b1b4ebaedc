//! Expansion snapshot input: `strategy = unique_insert`.
async fn record_payment(
    __idem_source: impl ::core::convert::Into<
        ::idem_runtime::__private::Source<'_, Sqlite>,
    >,
    cb: &Callback,
) -> ::core::result::Result<
    ::idem_runtime::__private::Outcome<()>,
    ::idem_runtime::__private::Error,
> {
    let __idem_span = ::idem_runtime::__private::span("record_payment", "unique_insert");
    let __idem_outer_span = ::core::clone::Clone::clone(&__idem_span);
    ::idem_runtime::__private::Instrument::instrument(
            async move {
                let __idem_key = ::idem_runtime::__private::reject_invalid(
                    &__idem_span,
                    ::idem_runtime::__private::KeyBuilder::new()
                        .lit("pay:")
                        .part("cb.serial", &cb.serial)
                        .finish(
                            ::core::option::Option::Some(|__idem_k: &str| {
                                ::idem_runtime::__private::validate(check_serial, __idem_k)
                            }),
                        ),
                )?;
                let __idem_spec = ::idem_runtime::__private::UniqueInsert {
                    scope: "record_payment",
                    constraint: "payment.serial",
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
                let __idem_body: Result<(), sqlx::Error> = {
                    let tx: &mut Transaction<'_, Sqlite> = __idem_call.tx();
                    async move {
                        sqlx::query("INSERT INTO payment (serial, amount) VALUES (?, ?)")
                            .bind(&cb.serial)
                            .bind(cb.amount)
                            .execute(&mut **tx)
                            .await?;
                        Ok(())
                    }
                        .await
                };
                __idem_call.finish(&__idem_spec, __idem_body).await
            },
            __idem_outer_span,
        )
        .await
}
