//! Expansion snapshot input: `strategy = state_machine`.
async fn deduct(
    __idem_source: impl ::core::convert::Into<
        ::idem_runtime::__private::Source<'_, Sqlite>,
    >,
    msg: &DeductCoupon,
) -> ::core::result::Result<
    ::idem_runtime::__private::Outcome<()>,
    ::idem_runtime::__private::Error,
> {
    let __idem_span = ::idem_runtime::__private::span("deduct", "state_machine");
    let __idem_outer_span = ::core::clone::Clone::clone(&__idem_span);
    ::idem_runtime::__private::Instrument::instrument(
            async move {
                let __idem_key = ::idem_runtime::__private::reject_invalid(
                    &__idem_span,
                    ::idem_runtime::__private::KeyBuilder::new()
                        .lit("coupon-deduct:")
                        .part("msg.msg_id", &msg.msg_id)
                        .finish(::core::option::Option::None),
                )?;
                let __idem_spec = {
                    let (__idem_from, __idem_to) = ::idem_runtime::__private::states(
                        CouponState::Unused,
                        CouponState::Used,
                    );
                    ::idem_runtime::__private::StateMachine {
                        scope: "deduct",
                        table: "coupon",
                        id_column: "id",
                        state_column: "status",
                        key_column: ::core::option::Option::Some("deducted_by"),
                        id: ::idem_runtime::__private::entity_id(&msg.coupon_id),
                        from: __idem_from,
                        to: __idem_to,
                    }
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
                        sqlx::query("INSERT INTO deduction (coupon_id) VALUES (?)")
                            .bind(msg.coupon_id)
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
