//! Key parts of every kind: UUIDs, a newtype implementing `KeyPart`, tuple
//! fields, `&str`, `bool`, `char`, literal braces; and `validate = ...`.
#![allow(dead_code)]

use idem_runtime::{KeyPart, idempotent};
use sqlx::{Sqlite, Transaction};
use uuid::Uuid;

struct TenantId(String);

impl KeyPart for TenantId {
    fn write_key_part(&self, out: &mut String) {
        self.0.write_key_part(out)
    }
}

struct Import {
    tenant: TenantId,
    batch: Uuid,
    range: (u32, u32),
    dry_run: bool,
    grade: char,
}

fn no_spaces(key: &str) -> Result<(), String> {
    if key.contains(' ') {
        Err("keys cannot contain spaces".into())
    } else {
        Ok(())
    }
}

mod checks {
    pub fn short(key: &str) -> Result<(), std::fmt::Error> {
        if key.len() > 100 { Err(std::fmt::Error) } else { Ok(()) }
    }
}

#[idempotent(
    key = "{{import}}:{msg.tenant}:{msg.batch}:{msg.range.0}/{msg.range.1}:{msg.dry_run}:{msg.grade}:{source}",
    strategy = unique_insert,
    constraint = "import.batch",
    validate = no_spaces,
)]
async fn import(tx: &mut Transaction<'_, Sqlite>, msg: &Import, source: &str) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO import (batch) VALUES (?)")
        .bind(msg.batch.to_string())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[idempotent(
    key = "archive:{batch}",
    strategy = unique_insert,
    constraint = "archive.batch",
    validate = checks::short,
)]
async fn archive(tx: &mut Transaction<'_, Sqlite>, batch: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO archive (batch) VALUES (?)")
        .bind(batch.to_string())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

fn main() {}
