/*
 * store.c - the content-addressed spec and blob store on SQLite
 * (docs/store.md is the long form of this comment).
 *
 * Guarantees:
 *  - Bytes are only ever returned after they were re-hashed and found
 *    equal to their id; a mismatch is TOPOS_ERR_CORRUPT.
 *  - A put that returned TOPOS_OK is committed: the database runs in WAL
 *    mode with synchronous=FULL, so it survives the process being killed
 *    and, on hardware that honours fsync, power loss.
 *  - Every write happens in one BEGIN IMMEDIATE transaction, so a put is
 *    all or nothing and concurrent writers (threads or processes, each
 *    with its own connection) queue on SQLite's busy timeout instead of
 *    failing on a read-to-write upgrade.
 *  - store_open writes nothing to a file it has not recognised: a
 *    non-empty file is first inspected through a read-only connection,
 *    and only an empty file, an empty SQLite database or a topos store of
 *    this or an older schema version is opened for writing.
 *  - Ids are validated before any SQL sees them, and all SQL with a value
 *    in it is a prepared statement with bound parameters.
 *
 * Payloads (the bytes column) are written with zeroblob + incremental
 * blob I/O and read straight into the caller's buffer, so a large blob
 * costs one copy in memory, not three.
 *
 * Retention and budgets (docs/store.md):
 *  - Specs carry last_used_ms.  Uses (store_touch_spec) are collected in
 *    memory under their own mutex and written in one transaction before
 *    the next spec put, so a call that only reads a spec never waits for
 *    the write lock; a put marks its spec used in its own transaction.
 *  - A spec put then deletes least recently used specs, never the one put
 *    nor one the handle's in_use callback claims, while the spec bytes
 *    are over the handle's spec budget, all in the put's transaction.
 *  - The file's budget lives in meta ('store_bytes'), and every write
 *    transaction turns it into SQLite's max_page_count for its
 *    connection, so all handles on the file enforce it.  A put checks it
 *    first (pages in use + the payload) and SQLITE_FULL, the backstop, is
 *    reported the same way; either rolls the transaction back.
 */
#include "store.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* How long a connection waits for another writer before giving up. */
#define BUSY_TIMEOUT_MS 10000
/* Largest piece moved by one sqlite3_blob_read/write call. */
#define IO_CHUNK ((size_t)4 << 20)
/* After a checkpoint the WAL file is truncated back to this size, so one
 * large blob does not leave a file of its size behind. */
#define WAL_SIZE_LIMIT ((int64_t)64 << 20)
/* Room left in SQLite's largest value for the record around a payload. */
#define ROW_OVERHEAD 4096
/* Spec uses waiting in memory before they are written on their own. */
#define TOUCH_BATCH 1024
#define TOUCH_SLOTS (2 * TOUCH_BATCH) /* open addressing, half full at most */
/* Specs examined per query while retention looks for victims. */
#define RETENTION_BATCH 64

/* One waiting use: a spec id and when (ms since the epoch). */
typedef struct touch {
  char id[65];
  int64_t ms;
} touch;

struct topos_store {
  sqlite3 *db;
  pthread_mutex_t lock; /* serialises every use of db */
  int64_t blob_cap;
  int64_t max_payload; /* the largest payload SQLite can store */
  /* Spec retention (store_set_spec_budget); under lock. */
  int64_t spec_budget; /* 0 = none */
  store_in_use_fn in_use;
  void *in_use_ctx;
  /* The file's budget as last read from meta (0 = none); under lock. */
  int64_t store_budget;
  /* Waiting spec uses (store_touch_spec); under touch_lock, which is
   * never held while taking lock. */
  pthread_mutex_t touch_lock;
  touch *touches; /* TOUCH_SLOTS slots, id[0] == '\0' when empty */
  int ntouches;
  sqlite3_stmt *token_lookup; /* store_token_lookup's, prepared on first use */
};

/* --------------------------------------------------------------- errors */

static int fail(topos_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(topos_error *err, int code, const char *fmt, ...) {
  if (err == NULL) return code;
  err->code = code;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(err->message, sizeof err->message, fmt, ap);
  va_end(ap);
  if (n < 0) err->message[0] = '\0';
  return code;
}

/* A damaged database file is corruption; running out of memory or hitting
 * SQLite's size limit is memory; everything else (busy, locked, disk
 * full, permissions) means the file could not be used. */
static int sqlite_status(int rc) {
  switch (rc & 0xff) {
    case SQLITE_NOMEM:
    case SQLITE_TOOBIG:
      return TOPOS_ERR_MEMORY;
    case SQLITE_CORRUPT:
      return TOPOS_ERR_CORRUPT;
    default:
      return TOPOS_ERR_IO;
  }
}

static int sql_fail(sqlite3 *db, int rc, topos_error *err, const char *what) {
  return fail(err, sqlite_status(rc), "store: %s: %s (%s)", what,
              db != NULL ? sqlite3_errmsg(db) : sqlite3_errstr(rc),
              sqlite3_errstr(rc));
}

/* ------------------------------------------------------------ SQL helpers */

static int prepare(sqlite3 *db, const char *sql, sqlite3_stmt **out,
                   topos_error *err) {
  int rc = sqlite3_prepare_v2(db, sql, -1, out, NULL);
  if (rc != SQLITE_OK) {
    sqlite3_finalize(*out);
    *out = NULL;
    return sql_fail(db, rc, err, "prepare a statement");
  }
  return TOPOS_OK;
}

/* Runs fixed SQL that carries no values (DDL, pragmas, BEGIN/COMMIT). */
static int exec(sqlite3 *db, const char *sql, topos_error *err,
                const char *what) {
  int rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
  return rc == SQLITE_OK ? TOPOS_OK : sql_fail(db, rc, err, what);
}

/* Steps a statement that returns no row (or whose row is ignored). */
static int step_done(sqlite3 *db, sqlite3_stmt *stmt, topos_error *err,
                     const char *what) {
  int rc = sqlite3_step(stmt);
  if (rc == SQLITE_DONE || rc == SQLITE_ROW) return TOPOS_OK;
  return sql_fail(db, rc, err, what);
}

/* Writers take the write lock up front: a deferred transaction that reads
 * and then writes can fail with SQLITE_BUSY_SNAPSHOT without waiting. */
static int begin(sqlite3 *db, bool write, topos_error *err) {
  return exec(db, write ? "BEGIN IMMEDIATE" : "BEGIN", err,
              "begin a transaction");
}

static void rollback(sqlite3 *db) {
  if (!sqlite3_get_autocommit(db))
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
}

static int commit(sqlite3 *db, topos_error *err) {
  int status = exec(db, "COMMIT", err, "commit");
  if (status != TOPOS_OK) rollback(db);
  return status;
}

/* An int64 from a one-row, one-column query (0 for NULL). */
static int query_int64(sqlite3 *db, const char *sql, int64_t *out,
                       topos_error *err) {
  sqlite3_stmt *stmt;
  int status = prepare(db, sql, &stmt, err);
  if (status != TOPOS_OK) return status;
  int rc = sqlite3_step(stmt);
  if (rc == SQLITE_ROW) {
    *out = sqlite3_column_int64(stmt, 0);
  } else if (rc == SQLITE_DONE) {
    *out = 0;
  } else {
    status = sql_fail(db, rc, err, "query");
  }
  sqlite3_finalize(stmt);
  return status;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ----------------------------------------------------------------- ids */

static int check_id(const char *id, topos_error *err) {
  if (id == NULL) return fail(err, TOPOS_ERR_ARGUMENT, "store: id is NULL");
  /* Stops at the first character that is not lowercase hex, the NUL
   * included, so a short string is never read past its end. */
  for (int i = 0; i < 64; i++) {
    char c = id[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      return fail(err, TOPOS_ERR_ARGUMENT,
                  "store: invalid id: character %d is %s; an id is 64 "
                  "lowercase hex characters (SHA-256)",
                  i, c == '\0' ? "the end of the string" : "not lowercase hex");
    }
  }
  if (id[64] != '\0') {
    return fail(err, TOPOS_ERR_ARGUMENT,
                "store: invalid id: longer than 64 characters; an id is 64 "
                "lowercase hex characters (SHA-256)");
  }
  return TOPOS_OK;
}

/* The id of bytes; topos_sha256_hex leaves an empty string when OpenSSL
 * fails, which must not be mistaken for corruption. */
static int hash_bytes(const uint8_t *bytes, size_t len, char out[65],
                      topos_error *err) {
  topos_sha256_hex(bytes, len, out);
  if (strlen(out) != 64) {
    return fail(err, TOPOS_ERR_MEMORY, "store: SHA-256 of %zu bytes failed",
                len);
  }
  return TOPOS_OK;
}

/* -------------------------------------------------------- the two tables */

/* Specs and blobs share their layout and most of their code; `kind` holds
 * what differs.  Each keeps its small per-row facts (seq, id, size, times)
 * in one table and its bytes in a second one keyed by the same seq, so
 * that marking a blob used, listing or counting never reads or rewrites a
 * payload (an UPDATE rewrites its whole row, bytes included). */
typedef struct kind {
  const char *noun;    /* "spec" or "blob", for messages */
  const char *payload; /* the bytes table, for sqlite3_blob_open */
  /* ?1 id -> seq, size, whether the bytes row exists */
  const char *find;
  const char *insert;         /* ?1 id, ?2 size, ?3 created_ms */
  const char *insert_payload; /* ?1 seq, ?2 size (a zeroblob to fill) */
  const char *remove;         /* ?1 id (a trigger drops the bytes) */
  const char *own;            /* ?1 id, ?2 tenant: record an owner */
  const char *owned;          /* ?1 id, ?2 tenant -> a row when it owns it */
} kind;

static const kind SPECS = {
    "spec",
    "spec_bytes",
    "SELECT s.seq, s.size, p.seq IS NOT NULL FROM specs AS s "
    "LEFT JOIN spec_bytes AS p ON p.seq = s.seq WHERE s.id = ?1",
    "INSERT INTO specs (id, size, created_ms, last_used_ms) "
    "VALUES (?1, ?2, ?3, ?3)",
    "INSERT OR REPLACE INTO spec_bytes (seq, bytes) "
    "VALUES (?1, zeroblob(?2))",
    "DELETE FROM specs WHERE id = ?1",
    "INSERT OR IGNORE INTO spec_owners (spec_id, tenant) VALUES (?1, ?2)",
    "SELECT 1 FROM spec_owners WHERE spec_id = ?1 AND tenant = ?2",
};

/* A blob's last_used is a logical clock: one more than the largest in the
 * table, taken inside the write transaction, so the order is total across
 * every handle and process (wall clocks tie and step back). */
static const kind BLOBS = {
    "blob",
    "blob_bytes",
    "SELECT b.seq, b.size, p.seq IS NOT NULL FROM blobs AS b "
    "LEFT JOIN blob_bytes AS p ON p.seq = b.seq WHERE b.id = ?1",
    "INSERT INTO blobs (id, size, created_ms, last_used) "
    "VALUES (?1, ?2, ?3, (SELECT coalesce(max(last_used), 0) + 1 FROM blobs))",
    "INSERT OR REPLACE INTO blob_bytes (seq, bytes) "
    "VALUES (?1, zeroblob(?2))",
    "DELETE FROM blobs WHERE id = ?1",
    "INSERT OR IGNORE INTO blob_owners (blob_id, tenant) VALUES (?1, ?2)",
    "SELECT 1 FROM blob_owners WHERE blob_id = ?1 AND tenant = ?2",
};

static const char TOUCH_BLOB[] =
    "UPDATE blobs SET last_used = "
    "(SELECT coalesce(max(last_used), 0) + 1 FROM blobs) WHERE id = ?1";

/* What find_row learnt about one id. */
typedef struct row {
  bool found;
  bool has_payload; /* the bytes row exists */
  int64_t seq;
  int64_t size; /* as recorded at put */
} row;

static int find_row(sqlite3 *db, const kind *k, const char *id, row *r,
                    topos_error *err) {
  *r = (row){0};
  sqlite3_stmt *stmt;
  int status = prepare(db, k->find, &stmt, err);
  if (status != TOPOS_OK) return status;
  sqlite3_bind_text(stmt, 1, id, 64, SQLITE_STATIC);
  int rc = sqlite3_step(stmt);
  if (rc == SQLITE_ROW) {
    r->found = true;
    r->seq = sqlite3_column_int64(stmt, 0);
    r->size = sqlite3_column_int64(stmt, 1);
    r->has_payload = sqlite3_column_int(stmt, 2) != 0;
  } else if (rc != SQLITE_DONE) {
    status = sql_fail(db, rc, err, "look up an id");
  }
  sqlite3_finalize(stmt);
  return status;
}

static int open_payload(sqlite3 *db, const kind *k, int64_t seq, bool write,
                        sqlite3_blob **out, topos_error *err) {
  int rc = sqlite3_blob_open(db, "main", k->payload, "bytes", seq, write, out);
  if (rc != SQLITE_OK) {
    sqlite3_blob_close(*out);
    *out = NULL;
    return sql_fail(db, rc, err, "open stored bytes");
  }
  return TOPOS_OK;
}

/* Reads a row's bytes into a new buffer (inside the caller's transaction),
 * straight from the pages into the buffer.  Missing bytes, or bytes whose
 * length differs from the recorded size, are corrupt. */
static int read_payload(sqlite3 *db, const kind *k, const char *id,
                        const row *r, uint8_t **out, size_t *len,
                        topos_error *err) {
  if (!r->has_payload) {
    return fail(err, TOPOS_ERR_CORRUPT,
                "store: %s %s is corrupt: its bytes are missing", k->noun, id);
  }
  sqlite3_blob *blob;
  int status = open_payload(db, k, r->seq, false, &blob, err);
  if (status != TOPOS_OK) return status;
  int64_t n = sqlite3_blob_bytes(blob);
  if (n != r->size) {
    sqlite3_blob_close(blob);
    return fail(err, TOPOS_ERR_CORRUPT,
                "store: %s %s is corrupt: %lld bytes stored, %lld recorded",
                k->noun, id, (long long)n, (long long)r->size);
  }
  uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
  if (buf == NULL) {
    sqlite3_blob_close(blob);
    return fail(err, TOPOS_ERR_MEMORY,
                "store: no memory for %s %s (%lld bytes)", k->noun, id,
                (long long)n);
  }
  for (int64_t off = 0; off < n;) {
    int64_t piece = n - off < (int64_t)IO_CHUNK ? n - off : (int64_t)IO_CHUNK;
    int rc = sqlite3_blob_read(blob, buf + off, (int)piece, (int)off);
    if (rc != SQLITE_OK) {
      free(buf);
      sqlite3_blob_close(blob);
      return sql_fail(db, rc, err, "read stored bytes");
    }
    off += piece;
  }
  sqlite3_blob_close(blob);
  *out = buf;
  *len = (size_t)n;
  return TOPOS_OK;
}

/* Creates (or replaces) row seq's bytes as a zeroblob of len bytes and
 * fills it piece by piece: SQLite never builds a len-byte record. */
static int write_payload(sqlite3 *db, const kind *k, int64_t seq,
                         const uint8_t *bytes, size_t len, topos_error *err) {
  sqlite3_stmt *stmt;
  int status = prepare(db, k->insert_payload, &stmt, err);
  if (status != TOPOS_OK) return status;
  sqlite3_bind_int64(stmt, 1, seq);
  sqlite3_bind_int64(stmt, 2, (sqlite3_int64)len);
  status = step_done(db, stmt, err, "store bytes");
  sqlite3_finalize(stmt);
  if (status != TOPOS_OK || len == 0) return status;
  sqlite3_blob *blob;
  status = open_payload(db, k, seq, true, &blob, err);
  if (status != TOPOS_OK) return status;
  for (size_t off = 0; off < len;) {
    size_t piece = len - off < IO_CHUNK ? len - off : IO_CHUNK;
    int rc = sqlite3_blob_write(blob, bytes + off, (int)piece, (int)off);
    if (rc != SQLITE_OK) {
      sqlite3_blob_close(blob);
      return sql_fail(db, rc, err, "write bytes");
    }
    off += piece;
  }
  int rc = sqlite3_blob_close(blob);
  return rc == SQLITE_OK ? TOPOS_OK : sql_fail(db, rc, err, "write bytes");
}

/* Whether a row holds exactly these bytes (compared piece by piece). */
static int payload_equals(sqlite3 *db, const kind *k, const row *r,
                          const uint8_t *bytes, size_t len, bool *equal,
                          topos_error *err) {
  *equal = false;
  if (!r->has_payload || r->size != (int64_t)len) return TOPOS_OK;
  sqlite3_blob *blob;
  int status = open_payload(db, k, r->seq, false, &blob, err);
  if (status != TOPOS_OK) return status;
  *equal = (int64_t)sqlite3_blob_bytes(blob) == (int64_t)len;
  size_t piece_max = len < ((size_t)1 << 20) ? len : ((size_t)1 << 20);
  uint8_t *piece_buf = *equal && len > 0 ? malloc(piece_max) : NULL;
  if (*equal && len > 0 && piece_buf == NULL) {
    sqlite3_blob_close(blob);
    return fail(err, TOPOS_ERR_MEMORY, "store: no memory to compare bytes");
  }
  for (size_t off = 0; *equal && off < len;) {
    size_t piece = len - off < piece_max ? len - off : piece_max;
    int rc = sqlite3_blob_read(blob, piece_buf, (int)piece, (int)off);
    if (rc != SQLITE_OK) {
      status = sql_fail(db, rc, err, "read stored bytes");
      break;
    }
    if (memcmp(piece_buf, bytes + off, piece) != 0) *equal = false;
    off += piece;
  }
  free(piece_buf);
  sqlite3_blob_close(blob);
  return status;
}

static int insert_row(sqlite3 *db, const kind *k, const char *id,
                      const uint8_t *bytes, size_t len, int64_t *seq,
                      topos_error *err) {
  sqlite3_stmt *stmt;
  int status = prepare(db, k->insert, &stmt, err);
  if (status != TOPOS_OK) return status;
  sqlite3_bind_text(stmt, 1, id, 64, SQLITE_STATIC);
  sqlite3_bind_int64(stmt, 2, (sqlite3_int64)len);
  sqlite3_bind_int64(stmt, 3, now_ms());
  status = step_done(db, stmt, err, "insert a row");
  sqlite3_finalize(stmt);
  if (status != TOPOS_OK) return status;
  *seq = sqlite3_last_insert_rowid(db);
  return write_payload(db, k, *seq, bytes, len, err);
}

/* Runs one statement with ?1 = id and reports how many rows it changed. */
static int run_with_id(sqlite3 *db, const char *sql, const char *id,
                       int *changes, topos_error *err) {
  sqlite3_stmt *stmt;
  int status = prepare(db, sql, &stmt, err);
  if (status != TOPOS_OK) return status;
  sqlite3_bind_text(stmt, 1, id, 64, SQLITE_STATIC);
  status = step_done(db, stmt, err, "update the store");
  sqlite3_finalize(stmt);
  if (changes != NULL) *changes = status == TOPOS_OK ? sqlite3_changes(db) : 0;
  return status;
}

/* Deletes least recently used blobs until `incoming` more bytes fit under
 * `cap` (inside the caller's write transaction).  With an owner (a
 * tenant's put), only blobs no other tenant owns are candidates, and a
 * blob that still does not fit is refused (TOPOS_ERR_MEMORY; the caller
 * rolls the evictions back): another tenant's data is never dropped to
 * make room.  Without one (no auth, or the operator's cap), any blob. */
static int evict(sqlite3 *db, int64_t cap, int64_t incoming, const char *owner,
                 topos_error *err) {
  int64_t total = 0;
  int status =
      query_int64(db, "SELECT coalesce(sum(size), 0) FROM blobs", &total, err);
  if (status != TOPOS_OK) return status;
  if (total + incoming <= cap) return TOPOS_OK;
  sqlite3_stmt *oldest, *drop;
  status = prepare(db,
                   "SELECT seq, size FROM blobs AS b WHERE ?1 IS NULL OR "
                   "NOT EXISTS (SELECT 1 FROM blob_owners AS o WHERE "
                   "o.blob_id = b.id AND o.tenant != ?1) "
                   "ORDER BY last_used, seq LIMIT 1",
                   &oldest, err);
  if (status != TOPOS_OK) return status;
  if (owner != NULL) sqlite3_bind_text(oldest, 1, owner, -1, SQLITE_STATIC);
  status = prepare(db, "DELETE FROM blobs WHERE seq = ?1", &drop, err);
  if (status != TOPOS_OK) {
    sqlite3_finalize(oldest);
    return status;
  }
  while (status == TOPOS_OK && total + incoming > cap) {
    int rc = sqlite3_step(oldest);
    if (rc == SQLITE_DONE) break; /* nothing left to evict */
    if (rc != SQLITE_ROW) {
      status = sql_fail(db, rc, err, "find the least recently used blob");
      break;
    }
    int64_t seq = sqlite3_column_int64(oldest, 0);
    total -= sqlite3_column_int64(oldest, 1);
    sqlite3_reset(oldest);
    if (owner != NULL) sqlite3_bind_text(oldest, 1, owner, -1, SQLITE_STATIC);
    sqlite3_bind_int64(drop, 1, seq);
    status = step_done(db, drop, err, "evict a blob");
    sqlite3_reset(drop);
  }
  sqlite3_finalize(oldest);
  sqlite3_finalize(drop);
  if (status == TOPOS_OK && owner != NULL && total + incoming > cap) {
    status = fail(err, TOPOS_ERR_MEMORY,
                  "store: blob cap full: %lld of the %lld-byte cap are other "
                  "tenants' blobs, which are never evicted for tenant %s; a "
                  "blob of %lld bytes does not fit, so nothing was stored or "
                  "evicted",
                  (long long)total, (long long)cap, owner, (long long)incoming);
  }
  return status;
}

/* Records that `owner` owns id (inside the caller's write transaction). */
static int add_owner(sqlite3 *db, const kind *k, const char *id,
                     const char *owner, topos_error *err) {
  sqlite3_stmt *stmt;
  int status = prepare(db, k->own, &stmt, err);
  if (status != TOPOS_OK) return status;
  sqlite3_bind_text(stmt, 1, id, 64, SQLITE_STATIC);
  sqlite3_bind_text(stmt, 2, owner, -1, SQLITE_STATIC);
  status = step_done(db, stmt, err, "record an owner");
  sqlite3_finalize(stmt);
  return status;
}

/* ------------------------------------------------------------- budgets */

static int check_store(topos_store *st, topos_error *err) {
  return st != NULL ? TOPOS_OK
                    : fail(err, TOPOS_ERR_ARGUMENT, "store: store is NULL");
}

/* "16 GiB", "880.0 KiB", "512 bytes": sizes in messages. */
static const char *human(char buf[32], int64_t bytes) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) {
    snprintf(buf, 32, "%lld bytes", (long long)bytes);
    return buf;
  }
  double v = (double)bytes;
  int u = -1;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    u++;
  }
  if (v == (double)(int64_t)v)
    snprintf(buf, 32, "%lld %s", (long long)v, units[u]);
  else
    snprintf(buf, 32, "%.1f %s", v, units[u]);
  return buf;
}

/* The file's budget from meta (0 when none was set). */
static int read_store_budget(sqlite3 *db, int64_t *out, topos_error *err) {
  return query_int64(db,
                     "SELECT CAST(value AS INTEGER) FROM meta "
                     "WHERE key = 'store_bytes'",
                     out, err);
}

/* BEGIN IMMEDIATE, then the file's budget as this connection's
 * max_page_count: read inside the transaction, so a budget another handle
 * set is the one enforced. */
static int begin_write(topos_store *st, topos_error *err) {
  sqlite3 *db = st->db;
  int status = begin(db, true, err);
  if (status != TOPOS_OK) return status;
  int64_t budget = 0;
  status = read_store_budget(db, &budget, err);
  if (status == TOPOS_OK) st->store_budget = budget;
  if (status == TOPOS_OK && budget > 0) {
    int64_t page_size = 0;
    status = query_int64(db, "PRAGMA page_size", &page_size, err);
    if (status == TOPOS_OK && page_size > 0) {
      /* SQLite keeps the limit at least the file's current size. */
      int64_t pages = budget / page_size > 0 ? budget / page_size : 1;
      char sql[64];
      snprintf(sql, sizeof sql, "PRAGMA max_page_count = %lld",
               (long long)pages);
      status = exec(db, sql, err, "apply the store budget");
    }
  }
  if (status != TOPOS_OK) rollback(db);
  return status;
}

/* Bytes of the file's pages that hold data (free pages are reused first). */
static int used_bytes(sqlite3 *db, int64_t *out, topos_error *err) {
  int64_t pages = 0, free_pages = 0, page_size = 0;
  int status = query_int64(db, "PRAGMA page_count", &pages, err);
  if (status == TOPOS_OK)
    status = query_int64(db, "PRAGMA freelist_count", &free_pages, err);
  if (status == TOPOS_OK)
    status = query_int64(db, "PRAGMA page_size", &page_size, err);
  *out = (pages - free_pages) * page_size;
  return status;
}

static int store_full(topos_store *st, const kind *k, size_t len, int64_t used,
                      topos_error *err) {
  char b[32], u[32], a[32], exact[40] = "";
  if (len >= 1024) snprintf(exact, sizeof exact, " (%zu bytes)", len);
  return fail(err, TOPOS_ERR_MEMORY,
              "store full: %s budget (toposd --store-bytes), %s in use; "
              "storing a %s of %s%s would pass it, so nothing was stored "
              "(delete specs or blobs, or raise the budget)",
              human(b, st->store_budget), human(u, used), k->noun,
              human(a, (int64_t)len), exact);
}

/* Refuses, inside the write transaction, a payload that cannot fit under
 * the file's budget: at least len more bytes of pages are needed. */
static int check_room(topos_store *st, const kind *k, size_t len,
                      topos_error *err) {
  if (st->store_budget <= 0) return TOPOS_OK;
  int64_t used = 0;
  int status = used_bytes(st->db, &used, err);
  if (status != TOPOS_OK) return status;
  if (used + (int64_t)len > st->store_budget)
    return store_full(st, k, len, used, err);
  return TOPOS_OK;
}

int store_set_store_budget(topos_store *st, int64_t bytes, topos_error *err) {
  int status = check_store(st, err);
  if (status != TOPOS_OK) return status;
  if (bytes < 4096) {
    return fail(err, TOPOS_ERR_ARGUMENT,
                "store: the store budget must be at least 4096 bytes (one "
                "page), not %lld",
                (long long)bytes);
  }
  pthread_mutex_lock(&st->lock);
  sqlite3 *db = st->db;
  /* Written before this connection applies the budget (begin, not
   * begin_write), so setting it on a file already over it succeeds. */
  status = begin(db, true, err);
  if (status == TOPOS_OK) {
    sqlite3_stmt *stmt;
    status = prepare(db,
                     "INSERT OR REPLACE INTO meta (key, value) "
                     "VALUES ('store_bytes', CAST(?1 AS TEXT))",
                     &stmt, err);
    if (status == TOPOS_OK) {
      sqlite3_bind_int64(stmt, 1, bytes);
      status = step_done(db, stmt, err, "set the store budget");
      sqlite3_finalize(stmt);
    }
    if (status == TOPOS_OK) status = commit(db, err);
    if (status == TOPOS_OK) {
      st->store_budget = bytes;
    } else {
      rollback(db);
    }
  }
  pthread_mutex_unlock(&st->lock);
  return status;
}

/* ------------------------------------------------------------ touches */

static size_t touch_slot(const touch *slots, const char *id) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a over the first 16 chars */
  for (int i = 0; i < 16; i++)
    h = (h ^ (unsigned char)id[i]) * 1099511628211ull;
  size_t i = (size_t)h & (TOUCH_SLOTS - 1);
  while (slots[i].id[0] != '\0' && memcmp(slots[i].id, id, 64) != 0)
    i = (i + 1) & (TOUCH_SLOTS - 1);
  return i;
}

/* Moves the waiting touches into a new array (under touch_lock).  On
 * allocation failure they stay where they are. */
static int take_touches(topos_store *st, touch **out) {
  *out = NULL;
  if (st->ntouches == 0) return 0;
  touch *batch = malloc(sizeof *batch * (size_t)st->ntouches);
  if (batch == NULL) return 0;
  int n = 0;
  for (size_t i = 0; i < TOUCH_SLOTS; i++) {
    if (st->touches[i].id[0] == '\0') continue;
    batch[n++] = st->touches[i];
    st->touches[i].id[0] = '\0';
  }
  st->ntouches = 0;
  *out = batch;
  return n;
}

/* Writes touches in one transaction (lock held).  Marking specs used only
 * steers retention, so it commits without waiting for the disk, as a
 * blob's use does. */
static int write_touches(topos_store *st, const touch *t, int n,
                         topos_error *err) {
  if (n == 0) return TOPOS_OK;
  sqlite3 *db = st->db;
  int status = exec(db, "PRAGMA synchronous = NORMAL", err, "configure");
  if (status != TOPOS_OK) return status;
  status = begin_write(st, err);
  if (status == TOPOS_OK) {
    sqlite3_stmt *stmt;
    status = prepare(db,
                     "UPDATE specs SET last_used_ms = max(last_used_ms, ?2) "
                     "WHERE id = ?1",
                     &stmt, err);
    for (int i = 0; status == TOPOS_OK && i < n; i++) {
      sqlite3_bind_text(stmt, 1, t[i].id, 64, SQLITE_STATIC);
      sqlite3_bind_int64(stmt, 2, t[i].ms);
      status = step_done(db, stmt, err, "mark specs used");
      sqlite3_reset(stmt);
    }
    sqlite3_finalize(stmt);
    if (status == TOPOS_OK) {
      status = commit(db, err);
    } else {
      rollback(db);
    }
  }
  exec(db, "PRAGMA synchronous = FULL", NULL, "");
  return status;
}

/* Writes what is waiting (lock held). */
static int flush_touches_locked(topos_store *st, topos_error *err) {
  touch *batch;
  pthread_mutex_lock(&st->touch_lock);
  int n = take_touches(st, &batch);
  pthread_mutex_unlock(&st->touch_lock);
  int status = write_touches(st, batch, n, err);
  free(batch);
  return status;
}

int store_touch_spec(topos_store *st, const char *id, topos_error *err) {
  int status = check_store(st, err);
  if (status == TOPOS_OK) status = check_id(id, err);
  if (status != TOPOS_OK) return status;
  int64_t now = now_ms();
  touch *batch = NULL;
  int n = 0;
  pthread_mutex_lock(&st->touch_lock);
  size_t i = touch_slot(st->touches, id);
  if (st->touches[i].id[0] == '\0') {
    memcpy(st->touches[i].id, id, 65);
    st->touches[i].ms = now;
    st->ntouches++;
  } else if (st->touches[i].ms < now) {
    st->touches[i].ms = now;
  }
  if (st->ntouches >= TOUCH_BATCH) n = take_touches(st, &batch);
  pthread_mutex_unlock(&st->touch_lock);
  if (n > 0) {
    pthread_mutex_lock(&st->lock);
    status = write_touches(st, batch, n, err);
    pthread_mutex_unlock(&st->lock);
    free(batch);
  }
  return status;
}

int store_flush_touches(topos_store *st, topos_error *err) {
  int status = check_store(st, err);
  if (status != TOPOS_OK) return status;
  pthread_mutex_lock(&st->lock);
  status = flush_touches_locked(st, err);
  pthread_mutex_unlock(&st->lock);
  return status;
}

/* ----------------------------------------------------------- retention */

/* One candidate of a retention pass. */
typedef struct victim {
  int64_t seq, size, last_used_ms;
  char id[65];
} victim;

/* Deletes least recently used specs other than keep_seq, skipping those
 * in use, until the specs fit the spec budget (inside the caller's write
 * transaction, lock held).  When they cannot be made to fit and `incoming`
 * (the new spec's size) is >= 0, the put is refused. */
static int retain_specs(topos_store *st, int64_t keep_seq, int64_t incoming,
                        const char *owner, topos_error *err) {
  if (st->spec_budget <= 0) return TOPOS_OK;
  sqlite3 *db = st->db;
  int64_t total = 0;
  int status =
      query_int64(db, "SELECT coalesce(sum(size), 0) FROM specs", &total, err);
  if (status != TOPOS_OK || total <= st->spec_budget) return status;
  sqlite3_stmt *oldest = NULL, *drop = NULL;
  status = prepare(db,
                   "SELECT seq, id, size, last_used_ms FROM specs AS s "
                   "WHERE seq != ?1 AND (last_used_ms > ?2 OR "
                   "(last_used_ms = ?2 AND seq > ?3)) AND (?5 IS NULL OR "
                   "NOT EXISTS (SELECT 1 FROM spec_owners AS o WHERE "
                   "o.spec_id = s.id AND o.tenant != ?5)) "
                   "ORDER BY last_used_ms, seq LIMIT ?4",
                   &oldest, err);
  if (status == TOPOS_OK)
    status = prepare(db, "DELETE FROM specs WHERE seq = ?1", &drop, err);
  int64_t after_ms = INT64_MIN, after_seq = INT64_MIN, held = 0;
  victim batch[RETENTION_BATCH];
  while (status == TOPOS_OK && total > st->spec_budget) {
    /* A batch is read whole before anything is deleted, so no statement
     * steps over rows that are being deleted under it. */
    sqlite3_bind_int64(oldest, 1, keep_seq);
    sqlite3_bind_int64(oldest, 2, after_ms);
    sqlite3_bind_int64(oldest, 3, after_seq);
    sqlite3_bind_int(oldest, 4, RETENTION_BATCH);
    if (owner != NULL) sqlite3_bind_text(oldest, 5, owner, -1, SQLITE_STATIC);
    int n = 0, rc;
    while ((rc = sqlite3_step(oldest)) == SQLITE_ROW) {
      victim *v = &batch[n++];
      v->seq = sqlite3_column_int64(oldest, 0);
      const unsigned char *id = sqlite3_column_text(oldest, 1);
      snprintf(v->id, sizeof v->id, "%s", id ? (const char *)id : "");
      v->size = sqlite3_column_int64(oldest, 2);
      v->last_used_ms = sqlite3_column_int64(oldest, 3);
    }
    if (rc != SQLITE_DONE) status = sql_fail(db, rc, err, "find old specs");
    sqlite3_reset(oldest);
    if (status != TOPOS_OK || n == 0) break;
    for (int i = 0; i < n && status == TOPOS_OK && total > st->spec_budget;
         i++) {
      if (st->in_use != NULL && st->in_use(st->in_use_ctx, batch[i].id)) {
        held += batch[i].size;
        continue;
      }
      sqlite3_bind_int64(drop, 1, batch[i].seq);
      status = step_done(db, drop, err, "drop a spec");
      sqlite3_reset(drop);
      if (status == TOPOS_OK) total -= batch[i].size;
    }
    after_ms = batch[n - 1].last_used_ms;
    after_seq = batch[n - 1].seq;
  }
  sqlite3_finalize(oldest);
  sqlite3_finalize(drop);
  if (status == TOPOS_OK && total > st->spec_budget && incoming >= 0) {
    char b[32], t[32], h[32];
    status = fail(err, TOPOS_ERR_MEMORY,
                  "store: spec budget full: %s budget (toposd --spec-bytes), "
                  "%s of specs would stay, %s of them in use by running "
                  "calls; a new spec of %lld bytes does not fit, so nothing "
                  "was stored or dropped",
                  human(b, st->spec_budget), human(t, total), human(h, held),
                  (long long)incoming);
  }
  return status;
}

int store_set_spec_budget(topos_store *st, int64_t bytes,
                          store_in_use_fn in_use, void *ctx, topos_error *err) {
  int status = check_store(st, err);
  if (status != TOPOS_OK) return status;
  if (bytes < 0) {
    return fail(err, TOPOS_ERR_ARGUMENT,
                "store: the spec budget must not be negative (%lld)",
                (long long)bytes);
  }
  pthread_mutex_lock(&st->lock);
  st->spec_budget = bytes;
  st->in_use = in_use;
  st->in_use_ctx = ctx;
  if (bytes > 0) {
    flush_touches_locked(st, NULL);
    status = begin_write(st, err);
    if (status == TOPOS_OK) status = retain_specs(st, -1, -1, NULL, err);
    if (status == TOPOS_OK) status = commit(st->db, err);
    if (status != TOPOS_OK) rollback(st->db);
  }
  pthread_mutex_unlock(&st->lock);
  return status;
}

/* ------------------------------------------------- put, get, has, delete */

/* Refuses a payload the store cannot hold, before hashing it: cap is the
 * blob cap for a blob, the spec budget (0 = none) for a spec.  It is
 * checked again under the lock, where it cannot change. */
static int check_size(topos_store *st, const kind *k, size_t len, int64_t cap,
                      topos_error *err) {
  if ((uint64_t)len > (uint64_t)st->max_payload) {
    return fail(err, TOPOS_ERR_MEMORY,
                "store: %s of %zu bytes is larger than the largest value "
                "SQLite stores (%lld bytes)",
                k->noun, len, (long long)st->max_payload);
  }
  if (k == &BLOBS && (uint64_t)len > (uint64_t)cap) {
    return fail(err, TOPOS_ERR_MEMORY,
                "store: blob of %zu bytes is larger than the blob cap of "
                "%lld bytes",
                len, (long long)cap);
  }
  if (k == &SPECS && cap > 0 && (uint64_t)len > (uint64_t)cap) {
    return fail(err, TOPOS_ERR_MEMORY,
                "store: spec of %zu bytes is larger than the spec budget of "
                "%lld bytes (toposd --spec-bytes)",
                len, (long long)cap);
  }
  return TOPOS_OK;
}

/* Checks a tenant argument: NULL and "" are no tenant (NULL after). */
static int check_owner(const char **tenant, topos_error *err) {
  if (*tenant != NULL && (*tenant)[0] == '\0') *tenant = NULL;
  if (*tenant != NULL && !store_tenant_name_valid(*tenant))
    return fail(err, TOPOS_ERR_ARGUMENT,
                "store: '%.80s' is not a tenant name (1 to %d of a-z 0-9 _ -)",
                *tenant, STORE_TENANT_NAME_MAX);
  return TOPOS_OK;
}

static int put_object(topos_store *st, const kind *k, const char *owner,
                      const void *bytes, size_t len, char id_out[65],
                      topos_error *err) {
  int status = check_store(st, err);
  if (status == TOPOS_OK) status = check_owner(&owner, err);
  if (status != TOPOS_OK) return status;
  if (bytes == NULL && len > 0) {
    return fail(err, TOPOS_ERR_ARGUMENT, "store: %s bytes are NULL", k->noun);
  }
  if (id_out == NULL) {
    return fail(err, TOPOS_ERR_ARGUMENT, "store: id_out is NULL");
  }
  pthread_mutex_lock(&st->lock);
  int64_t cap = k == &BLOBS ? st->blob_cap : st->spec_budget;
  pthread_mutex_unlock(&st->lock);
  status = check_size(st, k, len, cap, err);
  if (status != TOPOS_OK) return status;
  const uint8_t *data = bytes != NULL ? bytes : (const uint8_t *)"";
  char id[65];
  status = hash_bytes(data, len, id, err);
  if (status != TOPOS_OK) return status;

  pthread_mutex_lock(&st->lock);
  sqlite3 *db = st->db;
  status =
      check_size(st, k, len, k == &BLOBS ? st->blob_cap : st->spec_budget, err);
  if (status != TOPOS_OK) goto out;
  /* Uses collected since the last put count for this put's retention. */
  if (k == &SPECS) flush_touches_locked(st, NULL);
  status = begin_write(st, err);
  if (status != TOPOS_OK) goto out;
  row r;
  status = find_row(db, k, id, &r, err);
  if (status != TOPOS_OK) goto out;
  int64_t seq = -1, incoming = -1; /* incoming: a new spec's size */
  if (r.found) {
    /* Same id, so the same bytes unless the row was damaged: comparing
     * lets a put of the right bytes heal it. */
    bool equal;
    status = payload_equals(db, k, &r, data, len, &equal, err);
    if (status != TOPOS_OK) goto out;
    seq = r.seq;
    if (equal) {
      if (k == &BLOBS) {
        status = run_with_id(db, TOUCH_BLOB, id, NULL, err);
      } else {
        sqlite3_stmt *stmt;
        status = prepare(db,
                         "UPDATE specs SET last_used_ms = "
                         "max(last_used_ms, ?2) WHERE seq = ?1",
                         &stmt, err);
        if (status != TOPOS_OK) goto out;
        sqlite3_bind_int64(stmt, 1, r.seq);
        sqlite3_bind_int64(stmt, 2, now_ms());
        status = step_done(db, stmt, err, "mark a spec used");
        sqlite3_finalize(stmt);
      }
      goto retain;
    }
    if (k == &SPECS) {
      /* A repaired spec keeps its place in the list. */
      status = check_room(st, k, len, err);
      if (status != TOPOS_OK) goto out;
      sqlite3_stmt *stmt;
      status =
          prepare(db, "UPDATE specs SET size = ?2 WHERE seq = ?1", &stmt, err);
      if (status != TOPOS_OK) goto out;
      sqlite3_bind_int64(stmt, 1, r.seq);
      sqlite3_bind_int64(stmt, 2, (sqlite3_int64)len);
      status = step_done(db, stmt, err, "repair a spec");
      sqlite3_finalize(stmt);
      if (status == TOPOS_OK) {
        status = write_payload(db, k, r.seq, data, len, err);
      }
      goto retain;
    }
    /* A damaged blob is put anew, under the cap like any other. */
    status = run_with_id(db, k->remove, id, NULL, err);
    if (status != TOPOS_OK) goto out;
  }
  if (k == &BLOBS) {
    status = evict(db, st->blob_cap, (int64_t)len, owner, err);
    if (status != TOPOS_OK) goto out;
  }
  status = check_room(st, k, len, err);
  if (status == TOPOS_OK) status = insert_row(db, k, id, data, len, &seq, err);
  incoming = (int64_t)len;
retain:
  if (status == TOPOS_OK && owner != NULL)
    status = add_owner(db, k, id, owner, err);
  if (status == TOPOS_OK && k == &SPECS)
    status = retain_specs(st, seq, incoming, owner, err);
  if (status == TOPOS_OK) status = commit(db, err);
out:
  if (status != TOPOS_OK) {
    /* SQLITE_FULL under a budget is the budget's backstop: the check
     * above counts only the payload, not the pages around it. */
    if (status == TOPOS_ERR_IO && (sqlite3_errcode(db) & 0xff) == SQLITE_FULL &&
        st->store_budget > 0) {
      int64_t used = 0;
      rollback(db);
      if (used_bytes(db, &used, NULL) == TOPOS_OK)
        status = store_full(st, k, len, used, err);
    }
    rollback(db);
  }
  pthread_mutex_unlock(&st->lock);
  if (status == TOPOS_OK) memcpy(id_out, id, 65);
  return status;
}

static int get_object(topos_store *st, const kind *k, const char *id,
                      uint8_t **bytes, size_t *len, topos_error *err) {
  if (bytes != NULL) *bytes = NULL;
  if (len != NULL) *len = 0;
  int status = check_store(st, err);
  if (status != TOPOS_OK) return status;
  if (bytes == NULL || len == NULL) {
    return fail(err, TOPOS_ERR_ARGUMENT, "store: bytes or len is NULL");
  }
  status = check_id(id, err);
  if (status != TOPOS_OK) return status;

  uint8_t *buf = NULL;
  size_t n = 0;
  pthread_mutex_lock(&st->lock);
  sqlite3 *db = st->db;
  status = begin(db, false, err);
  if (status == TOPOS_OK) {
    row r;
    status = find_row(db, k, id, &r, err);
    if (status == TOPOS_OK && !r.found) {
      status = fail(err, TOPOS_ERR_NOT_FOUND, "store: no %s %s", k->noun, id);
    }
    if (status == TOPOS_OK) status = read_payload(db, k, id, &r, &buf, &n, err);
    if (status == TOPOS_OK) {
      status = commit(db, err);
    } else {
      rollback(db);
    }
  }
  pthread_mutex_unlock(&st->lock);
  if (status != TOPOS_OK) {
    free(buf);
    return status;
  }

  /* Hashing can take a while for a large blob; other threads may use the
   * handle meanwhile. */
  char actual[65];
  status = hash_bytes(buf, n, actual, err);
  if (status != TOPOS_OK) {
    free(buf);
    return status;
  }
  if (memcmp(actual, id, 64) != 0) {
    free(buf);
    return fail(err, TOPOS_ERR_CORRUPT,
                "store: %s %s is corrupt: its stored bytes hash to %s", k->noun,
                id, actual);
  }

  if (k == &BLOBS) {
    /* Marking a blob used only steers eviction, so it is committed
     * without waiting for the disk (synchronous=NORMAL: it survives a
     * crash of the process, and the next durable commit syncs it), and a
     * failure to record it does not fail the read. */
    pthread_mutex_lock(&st->lock);
    if (exec(db, "PRAGMA synchronous = NORMAL", NULL, "") == TOPOS_OK) {
      run_with_id(db, TOUCH_BLOB, id, NULL, NULL);
      exec(db, "PRAGMA synchronous = FULL", NULL, "");
    }
    pthread_mutex_unlock(&st->lock);
  }
  *bytes = buf;
  *len = n;
  return TOPOS_OK;
}

static int delete_object(topos_store *st, const kind *k, const char *id,
                         topos_error *err) {
  int status = check_store(st, err);
  if (status == TOPOS_OK) status = check_id(id, err);
  if (status != TOPOS_OK) return status;
  int changes = 0;
  pthread_mutex_lock(&st->lock);
  status = run_with_id(st->db, k->remove, id, &changes, err);
  pthread_mutex_unlock(&st->lock);
  if (status != TOPOS_OK) return status;
  if (changes == 0) {
    return fail(err, TOPOS_ERR_NOT_FOUND, "store: no %s %s", k->noun, id);
  }
  return TOPOS_OK;
}

/* Looks an id up without reading its bytes. */
static int stat_object(topos_store *st, const kind *k, const char *id,
                       bool *found, int64_t *size, topos_error *err) {
  int status = check_store(st, err);
  if (status == TOPOS_OK) status = check_id(id, err);
  if (status != TOPOS_OK) return status;
  row r;
  pthread_mutex_lock(&st->lock);
  status = find_row(st->db, k, id, &r, err);
  pthread_mutex_unlock(&st->lock);
  *found = r.found;
  *size = r.size;
  return status;
}

int store_put_spec(topos_store *st, const void *bytes, size_t len,
                   char id_out[65], topos_error *err) {
  return put_object(st, &SPECS, NULL, bytes, len, id_out, err);
}

int store_put_spec_as(topos_store *st, const char *tenant, const void *bytes,
                      size_t len, char id_out[65], topos_error *err) {
  return put_object(st, &SPECS, tenant, bytes, len, id_out, err);
}

int store_put_blob_as(topos_store *st, const char *tenant, const void *bytes,
                      size_t len, char id_out[65], topos_error *err) {
  return put_object(st, &BLOBS, tenant, bytes, len, id_out, err);
}

/* Checks an id and a tenant (not NULL, not "") for the ownership calls. */
static int check_id_tenant(topos_store *st, const char *id, const char **tenant,
                           topos_error *err) {
  int status = check_store(st, err);
  if (status == TOPOS_OK) status = check_id(id, err);
  if (status == TOPOS_OK) status = check_owner(tenant, err);
  if (status == TOPOS_OK && *tenant == NULL)
    status = fail(err, TOPOS_ERR_ARGUMENT, "store: no tenant given");
  return status;
}

int store_blob_own(topos_store *st, const char *id, const char *tenant,
                   topos_error *err) {
  int status = check_id_tenant(st, id, &tenant, err);
  if (status != TOPOS_OK) return status;
  pthread_mutex_lock(&st->lock);
  status = begin_write(st, err);
  if (status == TOPOS_OK) status = add_owner(st->db, &BLOBS, id, tenant, err);
  if (status == TOPOS_OK)
    status = commit(st->db, err);
  else
    rollback(st->db);
  pthread_mutex_unlock(&st->lock);
  return status;
}

static int owned(topos_store *st, const kind *k, const char *id,
                 const char *tenant, bool *out, topos_error *err) {
  if (out == NULL) return fail(err, TOPOS_ERR_ARGUMENT, "store: out is NULL");
  *out = false;
  int status = check_id_tenant(st, id, &tenant, err);
  if (status != TOPOS_OK) return status;
  pthread_mutex_lock(&st->lock);
  sqlite3_stmt *stmt;
  status = prepare(st->db, k->owned, &stmt, err);
  if (status == TOPOS_OK) {
    sqlite3_bind_text(stmt, 1, id, 64, SQLITE_STATIC);
    sqlite3_bind_text(stmt, 2, tenant, -1, SQLITE_STATIC);
    int rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW || rc == SQLITE_DONE)
      *out = rc == SQLITE_ROW;
    else
      status = sql_fail(st->db, rc, err, "look an owner up");
    sqlite3_finalize(stmt);
  }
  pthread_mutex_unlock(&st->lock);
  return status;
}

int store_spec_owned(topos_store *st, const char *id, const char *tenant,
                     bool *out, topos_error *err) {
  return owned(st, &SPECS, id, tenant, out, err);
}

int store_blob_owned(topos_store *st, const char *id, const char *tenant,
                     bool *out, topos_error *err) {
  return owned(st, &BLOBS, id, tenant, out, err);
}

int store_get_spec(topos_store *st, const char *id, uint8_t **bytes,
                   size_t *len, topos_error *err) {
  return get_object(st, &SPECS, id, bytes, len, err);
}

int store_has_spec(topos_store *st, const char *id, bool *present,
                   topos_error *err) {
  if (present == NULL) {
    return fail(err, TOPOS_ERR_ARGUMENT, "store: present is NULL");
  }
  *present = false;
  int64_t size = 0;
  return stat_object(st, &SPECS, id, present, &size, err);
}

int store_delete_spec(topos_store *st, const char *id, topos_error *err) {
  return delete_object(st, &SPECS, id, err);
}

int store_put_blob(topos_store *st, const void *bytes, size_t len,
                   char id_out[65], topos_error *err) {
  return put_object(st, &BLOBS, NULL, bytes, len, id_out, err);
}

int store_get_blob(topos_store *st, const char *id, uint8_t **bytes,
                   size_t *len, topos_error *err) {
  return get_object(st, &BLOBS, id, bytes, len, err);
}

/* The stored size of an object; NOT_FOUND when there is none. */
static int stat_size(topos_store *st, const kind *k, const char *id,
                     int64_t *size, topos_error *err) {
  if (size == NULL) return fail(err, TOPOS_ERR_ARGUMENT, "store: size is NULL");
  *size = -1;
  bool found = false;
  int64_t n = 0;
  int status = stat_object(st, k, id, &found, &n, err);
  if (status != TOPOS_OK) return status;
  if (!found)
    return fail(err, TOPOS_ERR_NOT_FOUND, "store: no %s %s", k->noun, id);
  *size = n;
  return TOPOS_OK;
}

int store_stat_spec(topos_store *st, const char *id, int64_t *size,
                    topos_error *err) {
  return stat_size(st, &SPECS, id, size, err);
}

int store_stat_blob(topos_store *st, const char *id, int64_t *size,
                    topos_error *err) {
  return stat_size(st, &BLOBS, id, size, err);
}

int store_delete_blob(topos_store *st, const char *id, topos_error *err) {
  return delete_object(st, &BLOBS, id, err);
}

/* ------------------------------------------------------- list and stats */

int store_list_specs(topos_store *st, int64_t offset, int limit,
                     store_spec_info **out, int *n, topos_error *err) {
  return store_list_specs_of(st, NULL, offset, limit, out, n, err);
}

int store_list_specs_of(topos_store *st, const char *tenant, int64_t offset,
                        int limit, store_spec_info **out, int *n,
                        topos_error *err) {
  if (out != NULL) *out = NULL;
  if (n != NULL) *n = 0;
  int status = check_store(st, err);
  if (status == TOPOS_OK) status = check_owner(&tenant, err);
  if (status != TOPOS_OK) return status;
  if (out == NULL || n == NULL) {
    return fail(err, TOPOS_ERR_ARGUMENT, "store: out or n is NULL");
  }
  if (offset < 0 || limit < 0) {
    return fail(err, TOPOS_ERR_ARGUMENT,
                "store: list offset (%lld) and limit (%d) must not be negative",
                (long long)offset, limit);
  }
  if (limit == 0) return TOPOS_OK;

  store_spec_info *rows = NULL;
  int count = 0, capacity = 0;
  pthread_mutex_lock(&st->lock);
  sqlite3 *db = st->db;
  sqlite3_stmt *stmt;
  status = prepare(db,
                   tenant == NULL
                       ? "SELECT id, size, created_ms, last_used_ms FROM specs "
                         "ORDER BY seq DESC LIMIT ?1 OFFSET ?2"
                       : "SELECT s.id, s.size, s.created_ms, s.last_used_ms "
                         "FROM spec_owners AS o JOIN specs AS s "
                         "ON s.id = o.spec_id WHERE o.tenant = ?3 "
                         "ORDER BY s.seq DESC LIMIT ?1 OFFSET ?2",
                   &stmt, err);
  if (status == TOPOS_OK) {
    sqlite3_bind_int(stmt, 1, limit);
    sqlite3_bind_int64(stmt, 2, offset);
    if (tenant != NULL) sqlite3_bind_text(stmt, 3, tenant, -1, SQLITE_STATIC);
    int rc;
    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
      if (count == capacity) {
        int grown = capacity == 0          ? (limit < 64 ? limit : 64)
                    : capacity > limit / 2 ? limit
                                           : capacity * 2;
        store_spec_info *more = realloc(rows, (size_t)grown * sizeof *rows);
        if (more == NULL) {
          status = fail(err, TOPOS_ERR_MEMORY, "store: no memory to list");
          break;
        }
        rows = more;
        capacity = grown;
      }
      store_spec_info *row = &rows[count++];
      const unsigned char *id = sqlite3_column_text(stmt, 0);
      snprintf(row->id, sizeof row->id, "%s",
               id != NULL ? (const char *)id : "");
      row->size = sqlite3_column_int64(stmt, 1);
      row->created_ms = sqlite3_column_int64(stmt, 2);
      row->last_used_ms = sqlite3_column_int64(stmt, 3);
    }
    if (status == TOPOS_OK && rc != SQLITE_DONE) {
      status = sql_fail(db, rc, err, "list specs");
    }
    sqlite3_finalize(stmt);
  }
  pthread_mutex_unlock(&st->lock);
  if (status != TOPOS_OK) {
    free(rows);
    return status;
  }
  if (count == 0) {
    free(rows);
    rows = NULL;
  }
  *out = rows;
  *n = count;
  return TOPOS_OK;
}

/* Counts and byte sums of one table. */
static int table_totals(sqlite3 *db, const char *sql, int64_t *count,
                        int64_t *bytes, topos_error *err) {
  sqlite3_stmt *stmt;
  int status = prepare(db, sql, &stmt, err);
  if (status != TOPOS_OK) return status;
  int rc = sqlite3_step(stmt);
  if (rc == SQLITE_ROW) {
    *count = sqlite3_column_int64(stmt, 0);
    *bytes = sqlite3_column_int64(stmt, 1);
  } else {
    status = sql_fail(db, rc, err, "count rows");
  }
  sqlite3_finalize(stmt);
  return status;
}

int store_stats(topos_store *st, store_stats_info *out, topos_error *err) {
  int status = check_store(st, err);
  if (status != TOPOS_OK) return status;
  if (out == NULL) return fail(err, TOPOS_ERR_ARGUMENT, "store: out is NULL");
  memset(out, 0, sizeof *out);
  store_stats_info s = {0};
  pthread_mutex_lock(&st->lock);
  sqlite3 *db = st->db;
  s.blob_cap = st->blob_cap;
  s.spec_budget = st->spec_budget;
  status = begin(db, false, err);
  if (status == TOPOS_OK) {
    int64_t pages = 0, page_size = 0, version = 0;
    status =
        table_totals(db, "SELECT count(*), coalesce(sum(size), 0) FROM specs",
                     &s.spec_count, &s.spec_bytes, err);
    if (status == TOPOS_OK) {
      status =
          table_totals(db, "SELECT count(*), coalesce(sum(size), 0) FROM blobs",
                       &s.blob_count, &s.blob_bytes, err);
    }
    if (status == TOPOS_OK) {
      status = query_int64(db, "PRAGMA page_count", &pages, err);
    }
    if (status == TOPOS_OK) {
      status = query_int64(db, "PRAGMA page_size", &page_size, err);
    }
    if (status == TOPOS_OK) {
      status = query_int64(db, "SELECT max(version) FROM schema_version",
                           &version, err);
    }
    if (status == TOPOS_OK)
      status = read_store_budget(db, &s.store_budget, err);
    s.file_bytes = pages * page_size;
    s.schema_version = (int)version;
    if (status == TOPOS_OK) {
      status = commit(db, err);
    } else {
      rollback(db);
    }
  }
  pthread_mutex_unlock(&st->lock);
  if (status != TOPOS_OK) return status;
  *out = s;
  return TOPOS_OK;
}

int store_tenant_usage(topos_store *st, const char *tenant, store_usage *out,
                       topos_error *err) {
  int status = check_store(st, err);
  if (status == TOPOS_OK) status = check_owner(&tenant, err);
  if (status != TOPOS_OK) return status;
  if (out == NULL || tenant == NULL)
    return fail(err, TOPOS_ERR_ARGUMENT, "store: out or tenant is NULL");
  store_usage u = {0};
  pthread_mutex_lock(&st->lock);
  sqlite3 *db = st->db;
  static const char *const sql[2] = {
      "SELECT count(*), coalesce(sum(s.size), 0) FROM spec_owners AS o "
      "JOIN specs AS s ON s.id = o.spec_id WHERE o.tenant = ?1",
      "SELECT count(*), coalesce(sum(b.size), 0) FROM blob_owners AS o "
      "JOIN blobs AS b ON b.id = o.blob_id WHERE o.tenant = ?1"};
  int64_t *counts[2] = {&u.spec_count, &u.blob_count};
  int64_t *bytes[2] = {&u.spec_bytes, &u.blob_bytes};
  status = begin(db, false, err);
  for (int i = 0; i < 2 && status == TOPOS_OK; i++) {
    sqlite3_stmt *stmt;
    status = prepare(db, sql[i], &stmt, err);
    if (status != TOPOS_OK) break;
    sqlite3_bind_text(stmt, 1, tenant, -1, SQLITE_STATIC);
    int rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW) {
      *counts[i] = sqlite3_column_int64(stmt, 0);
      *bytes[i] = sqlite3_column_int64(stmt, 1);
    } else {
      status = sql_fail(db, rc, err, "count a tenant's rows");
    }
    sqlite3_finalize(stmt);
  }
  if (status == TOPOS_OK)
    status = commit(db, err);
  else
    rollback(db);
  pthread_mutex_unlock(&st->lock);
  if (status == TOPOS_OK) *out = u;
  return status;
}

int store_set_blob_cap(topos_store *st, int64_t bytes, topos_error *err) {
  int status = check_store(st, err);
  if (status != TOPOS_OK) return status;
  if (bytes <= 0) {
    return fail(err, TOPOS_ERR_ARGUMENT,
                "store: the blob cap must be positive, not %lld",
                (long long)bytes);
  }
  pthread_mutex_lock(&st->lock);
  sqlite3 *db = st->db;
  status = begin(db, true, err);
  if (status == TOPOS_OK) status = evict(db, bytes, 0, NULL, err);
  if (status == TOPOS_OK) status = commit(db, err);
  if (status == TOPOS_OK) {
    st->blob_cap = bytes;
  } else {
    rollback(db);
  }
  pthread_mutex_unlock(&st->lock);
  return status;
}

/* ------------------------------------------------------- tenants, tokens */

bool store_tenant_name_valid(const char *name) {
  if (name == NULL) return false;
  size_t n = 0;
  for (; name[n] != '\0'; n++) {
    char c = name[n];
    if (n >= STORE_TENANT_NAME_MAX) return false;
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '-'))
      return false;
  }
  return n > 0;
}

static int check_tenant_name(const char *name, topos_error *err) {
  if (store_tenant_name_valid(name)) return TOPOS_OK;
  return fail(err, TOPOS_ERR_ARGUMENT,
              "store: a tenant name is 1..%d characters of a-z, 0-9, '_' and "
              "'-'; \"%.80s\" is not",
              STORE_TENANT_NAME_MAX, name != NULL ? name : "(null)");
}

bool store_token_id_valid(const char *id) {
  size_t n = id != NULL ? strnlen(id, STORE_TOKEN_ID_LEN + 1) : 0;
  bool ok = n == STORE_TOKEN_ID_LEN;
  for (size_t i = 0; ok && i < n; i++)
    ok = (id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'f');
  return ok;
}

static int check_token_id(const char *id, topos_error *err) {
  if (store_token_id_valid(id)) return TOPOS_OK;
  return fail(err, TOPOS_ERR_ARGUMENT,
              "store: a token id is %d lowercase hex digits (topos token "
              "list shows them); \"%.40s\" is not",
              STORE_TOKEN_ID_LEN, id != NULL ? id : "(null)");
}

/* n random bytes as lowercase hex into out (2n + 1 bytes), from the
 * kernel's random source. */
static int random_hex(size_t n, char *out, topos_error *err) {
  uint8_t bytes[32];
  assert(n <= sizeof bytes);
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  size_t got = 0;
  while (fd >= 0 && got < n) {
    ssize_t r = read(fd, bytes + got, n - got);
    if (r <= 0 && errno != EINTR) break;
    if (r > 0) got += (size_t)r;
  }
  if (fd >= 0) close(fd);
  if (got < n)
    return fail(err, TOPOS_ERR_IO, "store: cannot read /dev/urandom: %s",
                strerror(errno));
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = hex[bytes[i] >> 4];
    out[2 * i + 1] = hex[bytes[i] & 15];
  }
  out[2 * n] = '\0';
  return TOPOS_OK;
}

/* Runs one statement with ?1 = text. */
static int run_with_text(sqlite3 *db, const char *sql, const char *text,
                         topos_error *err, const char *what) {
  sqlite3_stmt *stmt;
  int status = prepare(db, sql, &stmt, err);
  if (status != TOPOS_OK) return status;
  sqlite3_bind_text(stmt, 1, text, -1, SQLITE_STATIC);
  status = step_done(db, stmt, err, what);
  sqlite3_finalize(stmt);
  return status;
}

/* Whether tenant `name` exists, inside the caller's transaction. */
static int tenant_exists(sqlite3 *db, const char *name, bool *present,
                         topos_error *err) {
  sqlite3_stmt *stmt;
  int status = prepare(db, "SELECT 1 FROM tenants WHERE name = ?1", &stmt, err);
  if (status != TOPOS_OK) return status;
  sqlite3_bind_text(stmt, 1, name, -1, SQLITE_STATIC);
  int rc = sqlite3_step(stmt);
  if (rc == SQLITE_ROW || rc == SQLITE_DONE)
    *present = rc == SQLITE_ROW;
  else
    status = sql_fail(db, rc, err, "look a tenant up");
  sqlite3_finalize(stmt);
  return status;
}

int store_tenant_add(topos_store *st, const char *name, bool admin,
                     topos_error *err) {
  int status = check_store(st, err);
  if (status == TOPOS_OK) status = check_tenant_name(name, err);
  if (status != TOPOS_OK) return status;
  pthread_mutex_lock(&st->lock);
  sqlite3 *db = st->db;
  status = begin(db, true, err);
  bool present = false;
  if (status == TOPOS_OK) status = tenant_exists(db, name, &present, err);
  if (status == TOPOS_OK && present)
    status =
        fail(err, TOPOS_ERR_ARGUMENT, "store: tenant %s already exists", name);
  sqlite3_stmt *stmt = NULL;
  if (status == TOPOS_OK)
    status = prepare(db,
                     "INSERT INTO tenants (name, created_ms, admin) "
                     "VALUES (?1, ?2, ?3)",
                     &stmt, err);
  if (status == TOPOS_OK) {
    sqlite3_bind_text(stmt, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(stmt, 2, now_ms());
    sqlite3_bind_int(stmt, 3, admin ? 1 : 0);
    status = step_done(db, stmt, err, "add a tenant");
  }
  sqlite3_finalize(stmt);
  if (status == TOPOS_OK)
    status = commit(db, err);
  else
    rollback(db);
  pthread_mutex_unlock(&st->lock);
  return status;
}

int store_tenant_remove(topos_store *st, const char *name, topos_error *err) {
  int status = check_store(st, err);
  if (status == TOPOS_OK) status = check_tenant_name(name, err);
  if (status != TOPOS_OK) return status;
  pthread_mutex_lock(&st->lock);
  sqlite3 *db = st->db;
  status = begin(db, true, err);
  bool present = false;
  if (status == TOPOS_OK) status = tenant_exists(db, name, &present, err);
  if (status == TOPOS_OK && !present)
    status = fail(err, TOPOS_ERR_NOT_FOUND, "store: no tenant %s", name);
  if (status == TOPOS_OK)
    status = run_with_text(db, "DELETE FROM tokens WHERE tenant = ?1", name,
                           err, "delete a tenant's tokens");
  if (status == TOPOS_OK)
    status = run_with_text(db, "DELETE FROM spec_owners WHERE tenant = ?1",
                           name, err, "drop a tenant's specs");
  if (status == TOPOS_OK)
    status = run_with_text(db, "DELETE FROM blob_owners WHERE tenant = ?1",
                           name, err, "drop a tenant's blobs");
  if (status == TOPOS_OK)
    status = run_with_text(db, "DELETE FROM quotas WHERE tenant = ?1", name,
                           err, "drop a tenant's quotas");
  if (status == TOPOS_OK)
    status = run_with_text(db, "DELETE FROM tenants WHERE name = ?1", name, err,
                           "remove a tenant");
  if (status == TOPOS_OK)
    status = commit(db, err);
  else
    rollback(db);
  pthread_mutex_unlock(&st->lock);
  return status;
}

int store_tenant_list(topos_store *st, store_tenant_info **out, int *n,
                      topos_error *err) {
  if (out != NULL) *out = NULL;
  if (n != NULL) *n = 0;
  int status = check_store(st, err);
  if (status != TOPOS_OK) return status;
  if (out == NULL || n == NULL)
    return fail(err, TOPOS_ERR_ARGUMENT, "store: out or n is NULL");
  store_tenant_info *rows = NULL;
  int count = 0, capacity = 0;
  pthread_mutex_lock(&st->lock);
  sqlite3 *db = st->db;
  sqlite3_stmt *stmt;
  status = prepare(db,
                   "SELECT name, created_ms, admin, (SELECT count(*) FROM "
                   "tokens WHERE tenant = name AND revoked_ms = 0) "
                   "FROM tenants ORDER BY name",
                   &stmt, err);
  if (status == TOPOS_OK) {
    int rc;
    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
      if (count == capacity) {
        int grown = capacity ? capacity * 2 : 16;
        store_tenant_info *more = realloc(rows, (size_t)grown * sizeof *rows);
        if (more == NULL) {
          status = fail(err, TOPOS_ERR_MEMORY, "store: no memory to list");
          break;
        }
        rows = more;
        capacity = grown;
      }
      store_tenant_info *row = &rows[count++];
      const unsigned char *name = sqlite3_column_text(stmt, 0);
      snprintf(row->name, sizeof row->name, "%s",
               name != NULL ? (const char *)name : "");
      row->created_ms = sqlite3_column_int64(stmt, 1);
      row->admin = sqlite3_column_int(stmt, 2) != 0;
      row->live_tokens = sqlite3_column_int64(stmt, 3);
    }
    if (status == TOPOS_OK && rc != SQLITE_DONE)
      status = sql_fail(db, rc, err, "list tenants");
    sqlite3_finalize(stmt);
  }
  pthread_mutex_unlock(&st->lock);
  if (status != TOPOS_OK || count == 0) {
    free(rows);
    return status;
  }
  *out = rows;
  *n = count;
  return TOPOS_OK;
}

int store_tenant_count(topos_store *st, int64_t *n, topos_error *err) {
  int status = check_store(st, err);
  if (status != TOPOS_OK) return status;
  if (n == NULL) return fail(err, TOPOS_ERR_ARGUMENT, "store: n is NULL");
  pthread_mutex_lock(&st->lock);
  status = query_int64(st->db, "SELECT count(*) FROM tenants", n, err);
  pthread_mutex_unlock(&st->lock);
  return status;
}

int store_tenant_get(topos_store *st, const char *name, store_tenant_info *out,
                     topos_error *err) {
  int status = check_store(st, err);
  if (status == TOPOS_OK) status = check_tenant_name(name, err);
  if (status != TOPOS_OK) return status;
  if (out == NULL) return fail(err, TOPOS_ERR_ARGUMENT, "store: out is NULL");
  char key[STORE_TENANT_NAME_MAX + 1]; /* name may be out->name */
  snprintf(key, sizeof key, "%s", name);
  name = key;
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&st->lock);
  sqlite3 *db = st->db;
  sqlite3_stmt *stmt;
  status = prepare(db,
                   "SELECT name, created_ms, admin, (SELECT count(*) FROM "
                   "tokens WHERE tenant = name AND revoked_ms = 0) "
                   "FROM tenants WHERE name = ?1",
                   &stmt, err);
  if (status == TOPOS_OK) {
    sqlite3_bind_text(stmt, 1, name, -1, SQLITE_STATIC);
    int rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW) {
      snprintf(out->name, sizeof out->name, "%s", name);
      out->created_ms = sqlite3_column_int64(stmt, 1);
      out->admin = sqlite3_column_int(stmt, 2) != 0;
      out->live_tokens = sqlite3_column_int64(stmt, 3);
    } else if (rc == SQLITE_DONE) {
      status = fail(err, TOPOS_ERR_NOT_FOUND, "store: no tenant %s", name);
    } else {
      status = sql_fail(db, rc, err, "look a tenant up");
    }
    sqlite3_finalize(stmt);
  }
  pthread_mutex_unlock(&st->lock);
  return status;
}

int store_token_create(topos_store *st, const char *tenant,
                       char id_out[STORE_TOKEN_ID_LEN + 1],
                       char secret_out[STORE_TOKEN_SECRET_LEN + 1],
                       topos_error *err) {
  int status = check_store(st, err);
  if (status == TOPOS_OK) status = check_tenant_name(tenant, err);
  if (status != TOPOS_OK) return status;
  if (id_out == NULL || secret_out == NULL)
    return fail(err, TOPOS_ERR_ARGUMENT, "store: id_out or secret_out is NULL");
  char id[STORE_TOKEN_ID_LEN + 1], secret[STORE_TOKEN_SECRET_LEN + 1];
  char hash[65];
  memcpy(secret, "tps_", 4);
  status = random_hex(STORE_TOKEN_ID_LEN / 2, id, err);
  if (status == TOPOS_OK) status = random_hex(32, secret + 4, err);
  if (status != TOPOS_OK) return status;
  topos_sha256_hex(secret, strlen(secret), hash);
  pthread_mutex_lock(&st->lock);
  sqlite3 *db = st->db;
  status = begin(db, true, err);
  bool present = false;
  if (status == TOPOS_OK) status = tenant_exists(db, tenant, &present, err);
  if (status == TOPOS_OK && !present)
    status = fail(err, TOPOS_ERR_NOT_FOUND, "store: no tenant %s", tenant);
  sqlite3_stmt *stmt = NULL;
  if (status == TOPOS_OK)
    status = prepare(db,
                     "INSERT INTO tokens (id, tenant, hash, created_ms) "
                     "VALUES (?1, ?2, ?3, ?4)",
                     &stmt, err);
  if (status == TOPOS_OK) {
    sqlite3_bind_text(stmt, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(stmt, 2, tenant, -1, SQLITE_STATIC);
    sqlite3_bind_text(stmt, 3, hash, -1, SQLITE_STATIC);
    sqlite3_bind_int64(stmt, 4, now_ms());
    status = step_done(db, stmt, err, "create a token");
  }
  sqlite3_finalize(stmt);
  if (status == TOPOS_OK)
    status = commit(db, err);
  else
    rollback(db);
  pthread_mutex_unlock(&st->lock);
  if (status == TOPOS_OK) {
    memcpy(id_out, id, sizeof id);
    memcpy(secret_out, secret, sizeof secret);
  }
  /* The secret leaves this function only through secret_out. */
  memset(secret, 0, sizeof secret);
  return status;
}

static void token_row(sqlite3_stmt *stmt, store_token_info *row) {
  const unsigned char *id = sqlite3_column_text(stmt, 0);
  const unsigned char *tenant = sqlite3_column_text(stmt, 1);
  snprintf(row->id, sizeof row->id, "%s", id ? (const char *)id : "");
  snprintf(row->tenant, sizeof row->tenant, "%s",
           tenant ? (const char *)tenant : "");
  row->created_ms = sqlite3_column_int64(stmt, 2);
  row->revoked_ms = sqlite3_column_int64(stmt, 3);
  row->admin = sqlite3_column_int(stmt, 4) != 0;
}

int store_token_list(topos_store *st, const char *tenant,
                     store_token_info **out, int *n, topos_error *err) {
  if (out != NULL) *out = NULL;
  if (n != NULL) *n = 0;
  int status = check_store(st, err);
  if (status == TOPOS_OK) status = check_tenant_name(tenant, err);
  if (status != TOPOS_OK) return status;
  if (out == NULL || n == NULL)
    return fail(err, TOPOS_ERR_ARGUMENT, "store: out or n is NULL");
  store_token_info *rows = NULL;
  int count = 0, capacity = 0;
  pthread_mutex_lock(&st->lock);
  sqlite3 *db = st->db;
  status = begin(db, false, err);
  bool present = false;
  if (status == TOPOS_OK) status = tenant_exists(db, tenant, &present, err);
  if (status == TOPOS_OK && !present)
    status = fail(err, TOPOS_ERR_NOT_FOUND, "store: no tenant %s", tenant);
  sqlite3_stmt *stmt = NULL;
  if (status == TOPOS_OK)
    status = prepare(db,
                     "SELECT t.id, t.tenant, t.created_ms, t.revoked_ms, "
                     "n.admin FROM tokens t JOIN tenants n ON n.name = "
                     "t.tenant WHERE t.tenant = ?1 "
                     "ORDER BY t.created_ms DESC, t.id",
                     &stmt, err);
  if (status == TOPOS_OK) {
    sqlite3_bind_text(stmt, 1, tenant, -1, SQLITE_STATIC);
    int rc;
    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
      if (count == capacity) {
        int grown = capacity ? capacity * 2 : 16;
        store_token_info *more = realloc(rows, (size_t)grown * sizeof *rows);
        if (more == NULL) {
          status = fail(err, TOPOS_ERR_MEMORY, "store: no memory to list");
          break;
        }
        rows = more;
        capacity = grown;
      }
      token_row(stmt, &rows[count++]);
    }
    if (status == TOPOS_OK && rc != SQLITE_DONE)
      status = sql_fail(db, rc, err, "list tokens");
  }
  sqlite3_finalize(stmt);
  rollback(db); /* ends the read transaction */
  pthread_mutex_unlock(&st->lock);
  if (status != TOPOS_OK || count == 0) {
    free(rows);
    return status;
  }
  *out = rows;
  *n = count;
  return TOPOS_OK;
}

int store_token_revoke(topos_store *st, const char *id, topos_error *err) {
  int status = check_store(st, err);
  if (status == TOPOS_OK) status = check_token_id(id, err);
  if (status != TOPOS_OK) return status;
  pthread_mutex_lock(&st->lock);
  sqlite3 *db = st->db;
  status = begin(db, true, err);
  sqlite3_stmt *stmt = NULL;
  if (status == TOPOS_OK)
    status = prepare(db,
                     "UPDATE tokens SET revoked_ms = "
                     "CASE WHEN revoked_ms = 0 THEN ?2 ELSE revoked_ms END "
                     "WHERE id = ?1",
                     &stmt, err);
  if (status == TOPOS_OK) {
    sqlite3_bind_text(stmt, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(stmt, 2, now_ms());
    status = step_done(db, stmt, err, "revoke a token");
    if (status == TOPOS_OK && sqlite3_changes(db) == 0)
      status = fail(err, TOPOS_ERR_NOT_FOUND, "store: no token %s", id);
  }
  sqlite3_finalize(stmt);
  if (status == TOPOS_OK)
    status = commit(db, err);
  else
    rollback(db);
  pthread_mutex_unlock(&st->lock);
  return status;
}

int store_token_get(topos_store *st, const char *id, store_token_info *out,
                    topos_error *err) {
  int status = check_store(st, err);
  if (status == TOPOS_OK) status = check_token_id(id, err);
  if (status != TOPOS_OK) return status;
  if (out == NULL) return fail(err, TOPOS_ERR_ARGUMENT, "store: out is NULL");
  char key[STORE_TOKEN_ID_LEN + 1]; /* id may be out->id */
  memcpy(key, id, sizeof key);
  id = key;
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&st->lock);
  sqlite3 *db = st->db;
  sqlite3_stmt *stmt;
  status = prepare(db,
                   "SELECT t.id, t.tenant, t.created_ms, t.revoked_ms, "
                   "n.admin FROM tokens t JOIN tenants n ON n.name = "
                   "t.tenant WHERE t.id = ?1",
                   &stmt, err);
  if (status == TOPOS_OK) {
    sqlite3_bind_text(stmt, 1, id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW)
      token_row(stmt, out);
    else if (rc == SQLITE_DONE)
      status = fail(err, TOPOS_ERR_NOT_FOUND, "store: no token %s", id);
    else
      status = sql_fail(db, rc, err, "look a token up");
    sqlite3_finalize(stmt);
  }
  pthread_mutex_unlock(&st->lock);
  return status;
}

int store_token_lookup(topos_store *st, const char *secret,
                       store_token_info *out, topos_error *err) {
  int status = check_store(st, err);
  if (status != TOPOS_OK) return status;
  if (secret == NULL || out == NULL)
    return fail(err, TOPOS_ERR_ARGUMENT, "store: secret or out is NULL");
  memset(out, 0, sizeof *out);
  char hash[65];
  topos_sha256_hex(secret, strlen(secret), hash);
  pthread_mutex_lock(&st->lock);
  sqlite3 *db = st->db;
  /* Prepared once per handle: the daemon asks on every call. */
  if (st->token_lookup == NULL)
    status = prepare(db,
                     "SELECT t.id, t.tenant, t.created_ms, t.revoked_ms, "
                     "n.admin FROM tokens t JOIN tenants n ON n.name = "
                     "t.tenant WHERE t.hash = ?1",
                     &st->token_lookup, err);
  if (status == TOPOS_OK) {
    sqlite3_stmt *stmt = st->token_lookup;
    sqlite3_bind_text(stmt, 1, hash, 64, SQLITE_STATIC);
    int rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW)
      token_row(stmt, out);
    else if (rc == SQLITE_DONE)
      status = fail(err, TOPOS_ERR_NOT_FOUND, "store: unknown token");
    else
      status = sql_fail(db, rc, err, "look a token up");
    sqlite3_reset(stmt);
    sqlite3_clear_bindings(stmt);
  }
  pthread_mutex_unlock(&st->lock);
  return status;
}

/* ------------------------------------------------- schema and migrations */

/* ---------------------------------------------------------------- quotas */

store_quota store_quota_unlimited(void) {
  return (store_quota){.stored_bytes = STORE_QUOTA_NONE,
                       .inflight = STORE_QUOTA_NONE,
                       .rate_per_s = STORE_QUOTA_NONE,
                       .burst = STORE_QUOTA_NONE,
                       .nodes_per_spec = STORE_QUOTA_NONE,
                       .run_ms = STORE_QUOTA_NONE,
                       .run_bytes = STORE_QUOTA_NONE,
                       .device_bytes = STORE_QUOTA_NONE,
                       .weight = STORE_QUOTA_NONE};
}

static int64_t column_quota(sqlite3_stmt *stmt, int i) {
  return sqlite3_column_type(stmt, i) == SQLITE_NULL
             ? STORE_QUOTA_NONE
             : sqlite3_column_int64(stmt, i);
}

/* Reads tenant's row into *q (unchanged when there is none). */
static int quota_read(sqlite3 *db, const char *tenant, store_quota *q,
                      bool *any, topos_error *err) {
  sqlite3_stmt *stmt;
  int status = prepare(db,
                       "SELECT stored_bytes, inflight, rate_per_s, burst, "
                       "nodes_per_spec, run_ms, run_bytes, weight, "
                       "device_bytes FROM quotas WHERE tenant = ?1",
                       &stmt, err);
  if (status != TOPOS_OK) return status;
  sqlite3_bind_text(stmt, 1, tenant, -1, SQLITE_STATIC);
  int rc = sqlite3_step(stmt);
  *any = false;
  if (rc == SQLITE_ROW) {
    q->stored_bytes = column_quota(stmt, 0);
    q->inflight = column_quota(stmt, 1);
    q->rate_per_s = sqlite3_column_type(stmt, 2) == SQLITE_NULL
                        ? STORE_QUOTA_NONE
                        : sqlite3_column_double(stmt, 2);
    q->burst = column_quota(stmt, 3);
    q->nodes_per_spec = column_quota(stmt, 4);
    q->run_ms = column_quota(stmt, 5);
    q->run_bytes = column_quota(stmt, 6);
    q->weight = column_quota(stmt, 7);
    q->device_bytes = column_quota(stmt, 8);
    *any = q->stored_bytes >= 0 || q->inflight >= 0 || q->rate_per_s > 0 ||
           q->nodes_per_spec >= 0 || q->run_ms >= 0 || q->run_bytes >= 0 ||
           q->device_bytes >= 0;
  } else if (rc != SQLITE_DONE) {
    status = sql_fail(db, rc, err, "read a tenant's quotas");
  }
  sqlite3_finalize(stmt);
  return status;
}

int store_quota_get(topos_store *st, const char *tenant, store_quota *out,
                    bool *any, topos_error *err) {
  int status = check_store(st, err);
  if (status == TOPOS_OK) status = check_tenant_name(tenant, err);
  if (status != TOPOS_OK) return status;
  if (out == NULL) return fail(err, TOPOS_ERR_ARGUMENT, "store: out is NULL");
  store_quota q = store_quota_unlimited();
  bool have = false;
  pthread_mutex_lock(&st->lock);
  status = quota_read(st->db, tenant, &q, &have, err);
  pthread_mutex_unlock(&st->lock);
  if (status != TOPOS_OK) return status;
  *out = q;
  if (any != NULL) *any = have;
  return TOPOS_OK;
}

static void bind_quota(sqlite3_stmt *stmt, int i, int64_t v) {
  if (v < 0)
    sqlite3_bind_null(stmt, i);
  else
    sqlite3_bind_int64(stmt, i, v);
}

int store_quota_check(const store_quota *q, unsigned mask, topos_error *err) {
  if (q == NULL) return fail(err, TOPOS_ERR_ARGUMENT, "store: q is NULL");
  static const struct {
    unsigned bit;
    size_t offset;
    const char *name;
  } counts[] = {
      {STORE_QUOTA_STORED_BYTES, offsetof(store_quota, stored_bytes),
       "stored_bytes"},
      {STORE_QUOTA_INFLIGHT, offsetof(store_quota, inflight), "inflight"},
      {STORE_QUOTA_NODES, offsetof(store_quota, nodes_per_spec),
       "nodes_per_spec"},
      {STORE_QUOTA_RUN_BYTES, offsetof(store_quota, run_bytes), "run_bytes"},
      {STORE_QUOTA_DEVICE_BYTES, offsetof(store_quota, device_bytes),
       "device_bytes"},
  };
  for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
    int64_t v = *(const int64_t *)((const char *)q + counts[i].offset);
    if ((mask & counts[i].bit) && v < STORE_QUOTA_NONE)
      return fail(err, TOPOS_ERR_ARGUMENT,
                  "store: quota %s must be a count (0 or more) or none, not "
                  "%lld",
                  counts[i].name, (long long)v);
  }
  if (mask & STORE_QUOTA_RATE) {
    bool rate = q->rate_per_s > 0, burst = q->burst >= 0;
    if (rate != burst || (!rate && q->rate_per_s != STORE_QUOTA_NONE) ||
        (!burst && q->burst != STORE_QUOTA_NONE))
      return fail(err, TOPOS_ERR_ARGUMENT,
                  "store: quota rate and burst go together: a rate (calls per "
                  "second, > 0) with a burst (>= 1), or both none");
    if (rate && (q->burst < 1 || !(q->rate_per_s <= 1e9)))
      return fail(err, TOPOS_ERR_ARGUMENT,
                  "store: quota burst must be at least 1 and rate at most 1e9 "
                  "per second");
  }
  if ((mask & STORE_QUOTA_RUN_MS) && q->run_ms < 1 &&
      q->run_ms != STORE_QUOTA_NONE)
    return fail(err, TOPOS_ERR_ARGUMENT,
                "store: quota run_ms must be at least 1 (or none)");
  if ((mask & STORE_QUOTA_WEIGHT) && q->weight != STORE_QUOTA_NONE &&
      (q->weight < 1 || q->weight > STORE_WEIGHT_MAX))
    return fail(err, TOPOS_ERR_ARGUMENT,
                "store: weight must be in 1..%d (or none: 1)",
                STORE_WEIGHT_MAX);
  return TOPOS_OK;
}

static void quota_text(int64_t v, char *out, size_t len) {
  if (v < 0)
    snprintf(out, len, "none");
  else
    snprintf(out, len, "%lld", (long long)v);
}

void store_quota_format(const store_quota *q, char *out, size_t len) {
  if (out == NULL || len == 0) return;
  if (q == NULL) {
    out[0] = '\0';
    return;
  }
  char v[7][24], rate[32];
  quota_text(q->stored_bytes, v[0], sizeof v[0]);
  quota_text(q->inflight, v[1], sizeof v[1]);
  quota_text(q->burst, v[2], sizeof v[2]);
  quota_text(q->nodes_per_spec, v[3], sizeof v[3]);
  quota_text(q->run_ms, v[4], sizeof v[4]);
  quota_text(q->run_bytes, v[5], sizeof v[5]);
  quota_text(q->device_bytes, v[6], sizeof v[6]);
  if (q->rate_per_s > 0)
    snprintf(rate, sizeof rate, "%g", q->rate_per_s);
  else
    snprintf(rate, sizeof rate, "none");
  snprintf(out, len,
           "stored_bytes=%s inflight=%s rate=%s burst=%s nodes_per_spec=%s "
           "run_ms=%s run_bytes=%s device_bytes=%s weight=%lld",
           v[0], v[1], rate, v[2], v[3], v[4], v[5], v[6],
           q->weight > 0 ? (long long)q->weight : 1LL);
}

int store_quota_set(topos_store *st, const char *tenant, const store_quota *q,
                    unsigned mask, topos_error *err) {
  int status = check_store(st, err);
  if (status == TOPOS_OK) status = check_tenant_name(tenant, err);
  if (status != TOPOS_OK) return status;
  status = store_quota_check(q, mask, err);
  if (status != TOPOS_OK) return status;
  bool rate = (mask & STORE_QUOTA_RATE) != 0;
  pthread_mutex_lock(&st->lock);
  sqlite3 *db = st->db;
  status = begin(db, true, err);
  bool present = false, any = false;
  if (status == TOPOS_OK) status = tenant_exists(db, tenant, &present, err);
  if (status == TOPOS_OK && !present)
    status = fail(err, TOPOS_ERR_NOT_FOUND, "store: no tenant %s", tenant);
  store_quota now = store_quota_unlimited();
  if (status == TOPOS_OK) status = quota_read(db, tenant, &now, &any, err);
  if (status == TOPOS_OK) {
    if (mask & STORE_QUOTA_STORED_BYTES) now.stored_bytes = q->stored_bytes;
    if (mask & STORE_QUOTA_INFLIGHT) now.inflight = q->inflight;
    if (rate) {
      now.rate_per_s = q->rate_per_s;
      now.burst = q->burst;
    }
    if (mask & STORE_QUOTA_NODES) now.nodes_per_spec = q->nodes_per_spec;
    if (mask & STORE_QUOTA_RUN_MS) now.run_ms = q->run_ms;
    if (mask & STORE_QUOTA_RUN_BYTES) now.run_bytes = q->run_bytes;
    if (mask & STORE_QUOTA_WEIGHT) now.weight = q->weight;
    if (mask & STORE_QUOTA_DEVICE_BYTES) now.device_bytes = q->device_bytes;
  }
  sqlite3_stmt *stmt = NULL;
  if (status == TOPOS_OK)
    status = prepare(db,
                     "INSERT OR REPLACE INTO quotas (tenant, stored_bytes, "
                     "inflight, rate_per_s, burst, nodes_per_spec, run_ms, "
                     "run_bytes, weight, device_bytes) VALUES (?1, ?2, ?3, ?4, "
                     "?5, ?6, ?7, ?8, ?9, ?10)",
                     &stmt, err);
  if (status == TOPOS_OK) {
    sqlite3_bind_text(stmt, 1, tenant, -1, SQLITE_STATIC);
    bind_quota(stmt, 2, now.stored_bytes);
    bind_quota(stmt, 3, now.inflight);
    if (now.rate_per_s > 0)
      sqlite3_bind_double(stmt, 4, now.rate_per_s);
    else
      sqlite3_bind_null(stmt, 4);
    bind_quota(stmt, 5, now.burst);
    bind_quota(stmt, 6, now.nodes_per_spec);
    bind_quota(stmt, 7, now.run_ms);
    bind_quota(stmt, 8, now.run_bytes);
    bind_quota(stmt, 9, now.weight);
    bind_quota(stmt, 10, now.device_bytes);
    status = step_done(db, stmt, err, "set a tenant's quotas");
  }
  sqlite3_finalize(stmt);
  if (status == TOPOS_OK)
    status = commit(db, err);
  else
    rollback(db);
  pthread_mutex_unlock(&st->lock);
  return status;
}

/* A migration takes the schema from version v - 1 to v inside the open
 * write transaction; the runner records v in schema_version.  Adding v2 is
 * one more function and one more entry in MIGRATIONS (and bumping
 * STORE_SCHEMA_VERSION). */
typedef int (*migration)(sqlite3 *db, topos_error *err);

static int migrate_to_v1(sqlite3 *db, topos_error *err) {
  int status =
      exec(db,
           "CREATE TABLE meta ("
           "  key TEXT PRIMARY KEY NOT NULL,"
           "  value TEXT NOT NULL"
           ") WITHOUT ROWID;"
           "INSERT INTO meta (key, value) VALUES ('magic', 'topos-store');"
           "CREATE TABLE schema_version ("
           "  version INTEGER PRIMARY KEY NOT NULL,"
           "  applied_ms INTEGER NOT NULL"
           ");"
           /* Facts and bytes live apart (see `kind`); a trigger keeps
            * them paired. */
           "CREATE TABLE specs ("
           "  seq INTEGER PRIMARY KEY,"
           "  id TEXT NOT NULL UNIQUE CHECK (length(id) = 64),"
           "  size INTEGER NOT NULL CHECK (size >= 0),"
           "  created_ms INTEGER NOT NULL"
           ");"
           "CREATE TABLE spec_bytes ("
           "  seq INTEGER PRIMARY KEY,"
           "  bytes BLOB NOT NULL"
           ");"
           "CREATE TRIGGER specs_drop_bytes AFTER DELETE ON specs BEGIN"
           "  DELETE FROM spec_bytes WHERE seq = old.seq;"
           "END;"
           "CREATE TABLE blobs ("
           "  seq INTEGER PRIMARY KEY,"
           "  id TEXT NOT NULL UNIQUE CHECK (length(id) = 64),"
           "  size INTEGER NOT NULL CHECK (size >= 0),"
           "  created_ms INTEGER NOT NULL,"
           "  last_used INTEGER NOT NULL"
           ");"
           "CREATE TABLE blob_bytes ("
           "  seq INTEGER PRIMARY KEY,"
           "  bytes BLOB NOT NULL"
           ");"
           "CREATE TRIGGER blobs_drop_bytes AFTER DELETE ON blobs BEGIN"
           "  DELETE FROM blob_bytes WHERE seq = old.seq;"
           "END;"
           "CREATE INDEX blobs_by_last_use ON blobs (last_used);",
           err, "create the version 1 schema");
  if (status != TOPOS_OK) return status;
  /* The application id goes in SQLite's file header, where `file` and a
   * probe of a foreign database can see it without reading any table. */
  char sql[64];
  snprintf(sql, sizeof sql, "PRAGMA application_id = %d",
           (int)STORE_APPLICATION_ID);
  return exec(db, sql, err, "set the application id");
}

/* Version 2: specs get a last use, for retention.  A store's existing
 * specs start out last used when they were created. */
static int migrate_to_v2(sqlite3 *db, topos_error *err) {
  return exec(db,
              "ALTER TABLE specs ADD COLUMN last_used_ms INTEGER NOT NULL "
              "DEFAULT 0;"
              "UPDATE specs SET last_used_ms = created_ms;"
              "CREATE INDEX specs_by_last_use ON specs (last_used_ms);",
              err, "migrate to schema version 2");
}

/* Version 3: tenants and their tokens (docs/store.md, "Tenants and
 * tokens").  A token row keeps the SHA-256 of its secret, never the
 * secret; the unique index on the hash is the daemon's per-call lookup. */
static int migrate_to_v3(sqlite3 *db, topos_error *err) {
  return exec(db,
              "CREATE TABLE tenants ("
              "  name TEXT PRIMARY KEY NOT NULL"
              "    CHECK (length(name) BETWEEN 1 AND 64),"
              "  created_ms INTEGER NOT NULL,"
              "  admin INTEGER NOT NULL DEFAULT 0 CHECK (admin IN (0, 1))"
              ") WITHOUT ROWID;"
              "CREATE TABLE tokens ("
              "  id TEXT PRIMARY KEY NOT NULL CHECK (length(id) = 16),"
              "  tenant TEXT NOT NULL REFERENCES tenants (name),"
              "  hash TEXT NOT NULL UNIQUE CHECK (length(hash) = 64),"
              "  created_ms INTEGER NOT NULL,"
              "  revoked_ms INTEGER NOT NULL DEFAULT 0"
              ") WITHOUT ROWID;"
              "CREATE INDEX tokens_by_tenant ON tokens (tenant);",
              err, "migrate to schema version 3");
}

/* Version 4: who owns which spec and blob (docs/store.md, "Ownership").
 * Rows stored before it belong to no tenant.  Deleting a spec or blob
 * (delete, eviction, retention) drops its owners with it. */
static int migrate_to_v4(sqlite3 *db, topos_error *err) {
  return exec(db,
              "CREATE TABLE spec_owners ("
              "  spec_id TEXT NOT NULL CHECK (length(spec_id) = 64),"
              "  tenant TEXT NOT NULL"
              "    CHECK (length(tenant) BETWEEN 1 AND 64),"
              "  PRIMARY KEY (spec_id, tenant)"
              ") WITHOUT ROWID;"
              "CREATE INDEX spec_owners_by_tenant ON spec_owners (tenant);"
              "CREATE TABLE blob_owners ("
              "  blob_id TEXT NOT NULL CHECK (length(blob_id) = 64),"
              "  tenant TEXT NOT NULL"
              "    CHECK (length(tenant) BETWEEN 1 AND 64),"
              "  PRIMARY KEY (blob_id, tenant)"
              ") WITHOUT ROWID;"
              "CREATE INDEX blob_owners_by_tenant ON blob_owners (tenant);"
              "CREATE TRIGGER specs_drop_owners AFTER DELETE ON specs BEGIN"
              "  DELETE FROM spec_owners WHERE spec_id = old.id;"
              "END;"
              "CREATE TRIGGER blobs_drop_owners AFTER DELETE ON blobs BEGIN"
              "  DELETE FROM blob_owners WHERE blob_id = old.id;"
              "END;",
              err, "migrate to schema version 4");
}

/* Version 5: per-tenant quotas (docs/operations.md, "Quotas").  A NULL
 * column is no limit; a tenant without a row has none.  Removing the
 * tenant deletes its row (store_tenant_remove). */
static int migrate_to_v5(sqlite3 *db, topos_error *err) {
  return exec(db,
              "CREATE TABLE quotas ("
              "  tenant TEXT PRIMARY KEY NOT NULL"
              "    CHECK (length(tenant) BETWEEN 1 AND 64),"
              "  stored_bytes INTEGER CHECK (stored_bytes >= 0),"
              "  inflight INTEGER CHECK (inflight >= 0),"
              "  rate_per_s REAL CHECK (rate_per_s > 0),"
              "  burst INTEGER CHECK (burst >= 1),"
              "  nodes_per_spec INTEGER CHECK (nodes_per_spec >= 0),"
              "  run_ms INTEGER CHECK (run_ms >= 1),"
              "  run_bytes INTEGER CHECK (run_bytes >= 0),"
              "  CHECK ((rate_per_s IS NULL) = (burst IS NULL))"
              ") WITHOUT ROWID;",
              err, "migrate to schema version 5");
}

/* Version 6: a tenant's scheduling weight (docs/operations.md, "Fair
 * scheduling"); NULL is the default, 1. */
static int migrate_to_v6(sqlite3 *db, topos_error *err) {
  return exec(db,
              "ALTER TABLE quotas ADD COLUMN weight INTEGER"
              "  CHECK (weight BETWEEN 1 AND 1000);",
              err, "migrate to schema version 6");
}

/* Version 7: a tenant's device memory per run (docs/operations.md,
 * "Quotas"); NULL is no limit. */
static int migrate_to_v7(sqlite3 *db, topos_error *err) {
  return exec(db,
              "ALTER TABLE quotas ADD COLUMN device_bytes INTEGER"
              "  CHECK (device_bytes >= 0);",
              err, "migrate to schema version 7");
}

/* MIGRATIONS[v] takes a store from version v - 1 to v. */
static const migration MIGRATIONS[STORE_SCHEMA_VERSION + 1] = {
    NULL,          migrate_to_v1, migrate_to_v2, migrate_to_v3,
    migrate_to_v4, migrate_to_v5, migrate_to_v6, migrate_to_v7,
};

/* What a database holds, read in one transaction. */
typedef struct probe {
  int64_t application_id;
  int64_t objects; /* rows of sqlite_master */
  bool magic;      /* meta.magic is 'topos-store' */
  int64_t version; /* max(schema_version.version), 0 if unreadable */
} probe;

static int probe_db(sqlite3 *db, probe *p, topos_error *err) {
  memset(p, 0, sizeof *p);
  int status =
      query_int64(db, "PRAGMA application_id", &p->application_id, err);
  if (status == TOPOS_OK) {
    status =
        query_int64(db, "SELECT count(*) FROM sqlite_master", &p->objects, err);
  }
  if (status != TOPOS_OK || p->application_id != STORE_APPLICATION_ID) {
    return status;
  }
  /* Missing tables are a finding, not an error. */
  sqlite3_stmt *stmt;
  if (sqlite3_prepare_v2(db, "SELECT value FROM meta WHERE key = 'magic'", -1,
                         &stmt, NULL) == SQLITE_OK) {
    if (sqlite3_step(stmt) == SQLITE_ROW) {
      const unsigned char *v = sqlite3_column_text(stmt, 0);
      p->magic = v != NULL && strcmp((const char *)v, "topos-store") == 0;
    }
  }
  sqlite3_finalize(stmt);
  if (sqlite3_prepare_v2(db, "SELECT max(version) FROM schema_version", -1,
                         &stmt, NULL) == SQLITE_OK) {
    if (sqlite3_step(stmt) == SQLITE_ROW) {
      p->version = sqlite3_column_int64(stmt, 0);
    }
  }
  sqlite3_finalize(stmt);
  return TOPOS_OK;
}

/* Whether a probed database may be opened: *fresh when it is empty. */
static int judge(const char *path, const probe *p, bool *fresh,
                 topos_error *err) {
  *fresh = false;
  if (p->application_id == STORE_APPLICATION_ID) {
    if (!p->magic || p->version <= 0) {
      return fail(err, TOPOS_ERR_IO,
                  "store: %s carries the topos application id but has no "
                  "valid meta or schema_version table; refusing a damaged "
                  "store",
                  path);
    }
    if (p->version > STORE_SCHEMA_VERSION) {
      return fail(err, TOPOS_ERR_IO,
                  "store: %s has schema version %lld, newer than the "
                  "version %d this build knows; refusing to open it (use a "
                  "newer topos)",
                  path, (long long)p->version, STORE_SCHEMA_VERSION);
    }
    return TOPOS_OK;
  }
  if (p->application_id == 0 && p->objects == 0) {
    *fresh = true;
    return TOPOS_OK;
  }
  return fail(err, TOPOS_ERR_IO,
              "store: %s is not a topos store: it is another application's "
              "SQLite database (application id 0x%08llx, %lld schema "
              "objects); refusing to touch it",
              path, (unsigned long long)(uint32_t)p->application_id,
              (long long)p->objects);
}

/* Refuses a non-empty file that is not SQLite before SQLite sees it, and
 * sets *exists when there is a non-empty file to inspect. */
static int check_file(const char *path, bool *exists, topos_error *err) {
  *exists = false;
  struct stat sb;
  if (stat(path, &sb) != 0) {
    if (errno == ENOENT) return TOPOS_OK;
    return fail(err, TOPOS_ERR_IO, "store: cannot use %s: %s", path,
                strerror(errno));
  }
  if (!S_ISREG(sb.st_mode)) {
    return fail(err, TOPOS_ERR_IO, "store: %s is not a regular file", path);
  }
  if (sb.st_size == 0) return TOPOS_OK;
  /* The header is read through SQLite's own file layer, never a
   * descriptor of ours: closing any descriptor of a file drops every POSIX
   * lock this process holds on it, so a plain open()/close() here, while
   * another handle of this process (the daemon's blob writer, its token
   * checker) has the store open, would let another process (the topos
   * CLI) take the exclusive lock, checkpoint and delete the WAL under
   * our connections.  SQLite's unix layer defers such closes.  Opening a
   * connection reads nothing; xRead is a plain read of 16 bytes. */
  static const char magic[16] = "SQLite format 3";
  char header[16];
  memset(header, 0, sizeof header);
  ssize_t got = 0;
  sqlite3 *probe_db = NULL;
  int rc = sqlite3_open_v2(path, &probe_db,
                           SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL);
  sqlite3_file *file = NULL;
  if (rc == SQLITE_OK)
    rc = sqlite3_file_control(probe_db, "main", SQLITE_FCNTL_FILE_POINTER,
                              &file);
  if (rc == SQLITE_OK && file != NULL && file->pMethods != NULL) {
    rc = file->pMethods->xRead(file, header, (int)sizeof header, 0);
    if (rc == SQLITE_OK) got = (ssize_t)sizeof header;
  } else if (rc != SQLITE_OK) {
    int saved = errno;
    sqlite3_close(probe_db);
    return fail(err, TOPOS_ERR_IO, "store: cannot read %s: %s", path,
                strerror(saved));
  }
  sqlite3_close(probe_db);
  if (got < (ssize_t)sizeof header || memcmp(header, magic, sizeof magic)) {
    return fail(err, TOPOS_ERR_IO,
                "store: %s is not a topos store: it is not an SQLite "
                "database; refusing to touch it",
                path);
  }
  *exists = true;
  return TOPOS_OK;
}

/* Inspects an existing file through a read-only connection, which can
 * neither write the file nor roll back a foreign hot journal into it. */
static int inspect(const char *path, topos_error *err) {
  sqlite3 *db = NULL;
  int rc = sqlite3_open_v2(path, &db,
                           SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL);
  int status = TOPOS_OK;
  if (rc != SQLITE_OK) {
    status = fail(err, TOPOS_ERR_IO, "store: cannot open %s: %s", path,
                  db != NULL ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
    sqlite3_close_v2(db);
    return status;
  }
  sqlite3_busy_timeout(db, BUSY_TIMEOUT_MS);
  probe p;
  status = begin(db, false, err);
  if (status == TOPOS_OK) status = probe_db(db, &p, err);
  int code = sqlite3_errcode(db);
  rollback(db);
  if (status != TOPOS_OK) {
    if ((code & 0xff) == SQLITE_NOTADB) {
      status = fail(err, TOPOS_ERR_IO,
                    "store: %s is not a topos store: it is not an SQLite "
                    "database; refusing to touch it",
                    path);
    }
  } else {
    bool fresh;
    status = judge(path, &p, &fresh, err);
  }
  sqlite3_close_v2(db);
  return status;
}

/* Brings the schema to STORE_SCHEMA_VERSION in one write transaction,
 * judging the file again inside it: another handle may have created or
 * migrated it since it was inspected. */
static int migrate(sqlite3 *db, const char *path, topos_error *err) {
  int status = begin(db, true, err);
  if (status != TOPOS_OK) return status;
  probe p;
  bool fresh = false;
  status = probe_db(db, &p, err);
  if (status == TOPOS_OK) status = judge(path, &p, &fresh, err);
  int64_t from = fresh ? 0 : p.version;
  sqlite3_stmt *record = NULL;
  for (int64_t v = from + 1; status == TOPOS_OK && v <= STORE_SCHEMA_VERSION;
       v++) {
    assert(v >= 1 && MIGRATIONS[v] != NULL); /* judge refused the rest */
    status = MIGRATIONS[v](db, err);
    if (status != TOPOS_OK) break;
    /* Prepared after a migration ran: v1 creates the table. */
    if (record == NULL) {
      status = prepare(db,
                       "INSERT INTO schema_version (version, applied_ms) "
                       "VALUES (?1, ?2)",
                       &record, err);
      if (status != TOPOS_OK) break;
    }
    sqlite3_bind_int64(record, 1, v);
    sqlite3_bind_int64(record, 2, now_ms());
    status = step_done(db, record, err, "record a schema version");
    sqlite3_reset(record);
  }
  sqlite3_finalize(record);
  if (status == TOPOS_OK) return commit(db, err);
  rollback(db);
  return status;
}

static int64_t monotonic_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Switches the file to WAL mode (a no-op once it is).  The switch of a
 * fresh file needs its exclusive lock, and when two connections race for
 * it SQLite answers one of them SQLITE_BUSY at once instead of calling the
 * busy handler (waiting could deadlock), so the retry is ours. */
static int use_wal(sqlite3 *db, const char *path, topos_error *err) {
  int64_t deadline = monotonic_ms() + BUSY_TIMEOUT_MS;
  for (;;) {
    sqlite3_stmt *stmt;
    int status = prepare(db, "PRAGMA journal_mode = WAL", &stmt, err);
    if (status != TOPOS_OK) return status;
    int rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW) {
      const unsigned char *mode = sqlite3_column_text(stmt, 0);
      if (mode == NULL || strcmp((const char *)mode, "wal") != 0) {
        status = fail(err, TOPOS_ERR_IO,
                      "store: %s cannot run in WAL mode (journal mode %s)",
                      path, mode != NULL ? (const char *)mode : "unknown");
      }
      sqlite3_finalize(stmt);
      return status;
    }
    status = sql_fail(db, rc, err, "switch to WAL mode");
    sqlite3_finalize(stmt);
    if ((rc & 0xff) != SQLITE_BUSY && (rc & 0xff) != SQLITE_LOCKED) {
      return status;
    }
    if (monotonic_ms() > deadline) return status;
    usleep(2000);
  }
}

topos_store *store_open(const char *path, topos_error *err) {
  if (path == NULL || path[0] == '\0') {
    fail(err, TOPOS_ERR_ARGUMENT, "store: path is NULL or empty");
    return NULL;
  }
  if (!sqlite3_threadsafe()) {
    fail(err, TOPOS_ERR_IO, "store: SQLite was built without thread support");
    return NULL;
  }
  bool exists;
  if (check_file(path, &exists, err) != TOPOS_OK) return NULL;
  if (exists && inspect(path, err) != TOPOS_OK) return NULL;
  /* A store holds whatever its clients recorded: the file is created
   * private here (SQLite would make it 0644 less the umask), and SQLite
   * gives its -wal and -shm files the database's mode.  An existing file,
   * empty or not, keeps the mode its owner gave it. */
  if (!exists) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) {
      close(fd);
    } else if (errno != EEXIST) {
      fail(err, TOPOS_ERR_IO, "store: cannot create %s: %s", path,
           strerror(errno));
      return NULL;
    }
  }

  topos_store *st = calloc(1, sizeof *st);
  touch *touches = calloc(TOUCH_SLOTS, sizeof *touches);
  if (st == NULL || touches == NULL) {
    free(st);
    free(touches);
    fail(err, TOPOS_ERR_MEMORY, "store: no memory for a store handle");
    return NULL;
  }
  st->blob_cap = STORE_DEFAULT_BLOB_CAP;
  st->touches = touches;
  if (pthread_mutex_init(&st->lock, NULL) != 0) {
    free(st->touches);
    free(st);
    fail(err, TOPOS_ERR_MEMORY, "store: cannot create a mutex");
    return NULL;
  }
  if (pthread_mutex_init(&st->touch_lock, NULL) != 0) {
    pthread_mutex_destroy(&st->lock);
    free(st->touches);
    free(st);
    fail(err, TOPOS_ERR_MEMORY, "store: cannot create a mutex");
    return NULL;
  }
  /* NOMUTEX: the handle's own mutex already serialises the connection. */
  int rc = sqlite3_open_v2(path, &st->db,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                               SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE,
                           NULL);
  int status = TOPOS_OK;
  if (rc != SQLITE_OK) {
    status = fail(err, TOPOS_ERR_IO, "store: cannot open %s: %s", path,
                  st->db != NULL ? sqlite3_errmsg(st->db) : sqlite3_errstr(rc));
  }
  sqlite3 *db = st->db;
  if (status == TOPOS_OK) sqlite3_busy_timeout(db, BUSY_TIMEOUT_MS);
  if (status == TOPOS_OK) status = use_wal(db, path, err);
  if (status == TOPOS_OK) {
    char sql[96];
    snprintf(sql, sizeof sql,
             "PRAGMA synchronous = FULL; PRAGMA journal_size_limit = %lld",
             (long long)WAL_SIZE_LIMIT);
    status = exec(db, sql, err, "configure the connection");
  }
  if (status == TOPOS_OK) status = migrate(db, path, err);
  if (status == TOPOS_OK) {
    /* SQLite's largest value (1e9 bytes unless built otherwise) less room
     * for the record around it; sqlite3_blob_read also takes int offsets. */
    int64_t limit = sqlite3_limit(db, SQLITE_LIMIT_LENGTH, -1) - ROW_OVERHEAD;
    st->max_payload = limit < INT_MAX ? limit : INT_MAX;
    status = read_store_budget(db, &st->store_budget, err);
  }
  if (status != TOPOS_OK) {
    store_close(st);
    return NULL;
  }
  return st;
}

void store_close(topos_store *st) {
  if (st == NULL) return;
  if (st->db != NULL) {
    pthread_mutex_lock(&st->lock);
    flush_touches_locked(st, NULL); /* best effort, like every touch */
    pthread_mutex_unlock(&st->lock);
  }
  sqlite3_finalize(st->token_lookup);
  sqlite3_close_v2(st->db);
  pthread_mutex_destroy(&st->touch_lock);
  pthread_mutex_destroy(&st->lock);
  free(st->touches);
  free(st);
}
