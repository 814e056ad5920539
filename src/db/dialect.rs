//! What the SQL stores need to know of the database they run on, so that one generic
//! implementation of each store serves Postgres and SQLite alike.
//!
//! Both databases take the same SQL (numbered `$n` parameters, `ON CONFLICT` upserts);
//! where a statement must differ, the store matches on [`Sql::DIALECT`] next to the two
//! texts.
//!
//! Rust does not carry a trait's `where` clauses over to the code that uses the trait, so
//! each generic `impl` of a store still lists the value types it binds and reads; [`ColumnType`]
//! keeps each of those to one bound.

use sqlx::query::Query;
use sqlx::{Database, Decode, Encode, QueryBuilder, Type};

/// Which database a store runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// `postgres://…`
    Postgres,
    /// `sqlite:…`
    Sqlite,
}

impl Dialect {
    /// The database as OpenTelemetry names it: the `db.system` of the stores' spans.
    pub(crate) const fn system(self) -> &'static str {
        match self {
            Self::Postgres => "postgresql",
            Self::Sqlite => "sqlite",
        }
    }
}

/// A database the SQL stores run on: implemented for Postgres and SQLite only.
pub(crate) trait Sql: Database {
    /// Which of the two it is.
    const DIALECT: Dialect;

    /// How many rows a statement inserted, updated or deleted (sqlx has no trait for it).
    fn rows_affected(result: &Self::QueryResult) -> u64;

    /// `sql.build()`, its arguments' lifetime shortened to the borrow of `sql`: generic code
    /// cannot do that itself (sqlx's `IntoArguments` holds only for equal lifetimes, and
    /// `sql` is dropped while its own lifetime lasts).
    fn build<'b, 'a: 'b>(
        sql: &'b mut QueryBuilder<'a, Self>,
    ) -> Query<'b, Self, Self::Arguments<'b>>;
}

impl Sql for sqlx::Postgres {
    const DIALECT: Dialect = Dialect::Postgres;

    fn rows_affected(result: &sqlx::postgres::PgQueryResult) -> u64 {
        result.rows_affected()
    }

    fn build<'b, 'a: 'b>(
        sql: &'b mut QueryBuilder<'a, Self>,
    ) -> Query<'b, Self, Self::Arguments<'b>> {
        sql.build()
    }
}

impl Sql for sqlx::Sqlite {
    const DIALECT: Dialect = Dialect::Sqlite;

    fn rows_affected(result: &sqlx::sqlite::SqliteQueryResult) -> u64 {
        result.rows_affected()
    }

    fn build<'b, 'a: 'b>(
        sql: &'b mut QueryBuilder<'a, Self>,
    ) -> Query<'b, Self, Self::Arguments<'b>> {
        sql.build()
    }
}

/// A Rust type that binds to a parameter of `DB` and reads back from one of its columns.
pub(crate) trait ColumnType<DB: Database>:
    for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB>
{
}

impl<DB: Database, T> ColumnType<DB> for T where
    T: for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB>
{
}
