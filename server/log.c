/*
 * log.c - request and event lines on stderr.
 *
 * Each line is formatted into a buffer on the stack and written with one
 * write(2), so lines from concurrent workers never interleave and logging
 * takes no lock.  Strings that came from a client or the engine (peer,
 * messages) are escaped, so a hostile spec name cannot forge a log line.
 */
#include "log.h"
#include "wire.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static _Atomic int current_format = LOG_TEXT;
static _Atomic int current_level = LOG_INFO;
static _Atomic int current_requests = LOG_REQUESTS_ALL;
static _Atomic int64_t current_sample = 1;
/* OK request lines seen, for sample:N (one written in N). */
static _Atomic uint64_t ok_seen;

void log_set_format(log_format format) {
  atomic_store(&current_format, (int)format);
}

void log_set_level(log_level level) {
  atomic_store(&current_level, (int)level);
}

void log_set_requests(log_requests which, int64_t sample) {
  atomic_store(&current_requests, (int)which);
  atomic_store(&current_sample, sample < 1 ? 1 : sample);
}

static const char *const level_names[] = {"debug", "info", "warn", "error"};

/* A line being built; overlong content is cut, never overflowed. */
typedef struct line_buf {
  char data[2048];
  size_t len;
} line_buf;

static void put_raw(line_buf *b, const char *s, size_t n) {
  size_t room = sizeof b->data - 1 - b->len; /* keep one byte for '\n' */
  if (n > room) n = room;
  memcpy(b->data + b->len, s, n);
  b->len += n;
}

/* A string value: JSON-escaped in quotes, or in text a bare word when it
 * is one, else quoted with the same escapes. */
static void put_string(line_buf *b, const char *s, bool json) {
  if (s == NULL) s = "";
  bool bare = !json && s[0] != '\0';
  for (const char *p = s; bare && *p; p++) {
    unsigned char c = (unsigned char)*p;
    if (c <= ' ' || c == '"' || c == '=' || c == '\\' || c >= 0x7f)
      bare = false;
  }
  if (bare) {
    put_raw(b, s, strlen(s));
    return;
  }
  put_raw(b, "\"", 1);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    char esc[8];
    if (*p == '"' || *p == '\\') {
      esc[0] = '\\';
      esc[1] = (char)*p;
      put_raw(b, esc, 2);
    } else if (*p == '\n') {
      put_raw(b, "\\n", 2);
    } else if (*p < 0x20 || *p >= 0x7f) {
      snprintf(esc, sizeof esc, "\\u%04x", *p);
      put_raw(b, esc, 6);
    } else {
      put_raw(b, (const char *)p, 1);
    }
  }
  put_raw(b, "\"", 1);
}

/* Keys and numbers are written without printf: a request line is on every
 * call's path, and a dozen vsnprintf calls cost microseconds. */
static void put_key(line_buf *b, const char *key, bool json, bool first) {
  if (!first) put_raw(b, json ? "," : " ", 1);
  if (json) put_raw(b, "\"", 1);
  put_raw(b, key, strlen(key));
  put_raw(b, json ? "\":" : "=", json ? 2 : 1);
}

/* u in decimal (%llu), after a '-' when negative. */
static void put_decimal(line_buf *b, unsigned long long u, bool negative) {
  char digits[24];
  int n = sizeof digits;
  do {
    digits[--n] = (char)('0' + u % 10);
    u /= 10;
  } while (u != 0);
  if (negative) digits[--n] = '-';
  put_raw(b, digits + n, sizeof digits - (size_t)n);
}

/* v as %lld writes it. */
static void put_int(line_buf *b, long long v) {
  put_decimal(b, v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v,
              v < 0);
}

/* v as exactly width digits (zero-padded; v fits). */
static void put_digits(char *out, long v, int width) {
  for (int i = width - 1; i >= 0; i--) {
    out[i] = (char)('0' + v % 10);
    v /= 10;
  }
}

static void put_time(line_buf *b, bool json, log_level level) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  /* "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ"; a year past 9999 is cut. */
  char when[28] = "0000-00-00T00:00:00.000000Z";
  put_digits(when, (long)(tm.tm_year + 1900) % 10000, 4);
  put_digits(when + 5, tm.tm_mon + 1, 2);
  put_digits(when + 8, tm.tm_mday, 2);
  put_digits(when + 11, tm.tm_hour, 2);
  put_digits(when + 14, tm.tm_min, 2);
  put_digits(when + 17, tm.tm_sec, 2);
  put_digits(when + 20, ts.tv_nsec / 1000, 6);
  if (json) put_raw(b, "{", 1);
  put_key(b, "ts", json, true);
  put_string(b, when, json);
  put_key(b, "level", json, false);
  put_string(b, level_names[level], json);
}

static void finish(line_buf *b, bool json) {
  if (json) {
    if (b->len >= sizeof b->data - 2) b->len = sizeof b->data - 3;
    b->data[b->len++] = '}';
  }
  b->data[b->len++] = '\n';
  ssize_t off = 0;
  while (off < (ssize_t)b->len) {
    ssize_t n = write(STDERR_FILENO, b->data + off, b->len - (size_t)off);
    if (n <= 0) break; /* a closed stderr must not stop the daemon */
    off += n;
  }
}

/* A request's level: OK is info; a fault of the daemon's (INTERNAL,
 * UNKNOWN, DATA_LOSS) is error; any other refusal is warn. */
static log_level request_level(int status) {
  if (status == WIRE_GRPC_OK) return LOG_INFO;
  if (status == WIRE_GRPC_INTERNAL || status == WIRE_GRPC_UNKNOWN ||
      status == WIRE_GRPC_DATA_LOSS)
    return LOG_ERROR;
  return LOG_WARN;
}

void log_request(const log_request_line *r) {
  log_level level = request_level(r->status);
  if ((int)level < atomic_load(&current_level)) return;
  int which = atomic_load(&current_requests);
  int64_t sample = 0;
  if (which == LOG_REQUESTS_NONE) return;
  if (which == LOG_REQUESTS_ERRORS && r->status == WIRE_GRPC_OK) return;
  if (which == LOG_REQUESTS_SAMPLE && r->status == WIRE_GRPC_OK) {
    sample = atomic_load(&current_sample);
    if (atomic_fetch_add(&ok_seen, 1) % (uint64_t)sample != 0) return;
  }
  bool json = atomic_load(&current_format) == LOG_JSON;
  line_buf b = {.len = 0};
  put_time(&b, json, level);
  put_key(&b, "event", json, false);
  put_string(&b, "request", json);
  put_key(&b, "req", json, false);
  put_decimal(&b, (unsigned long long)r->request_id, false);
  put_key(&b, "method", json, false);
  put_string(&b, r->method, json);
  put_key(&b, "spec", json, false);
  put_string(&b, r->spec_id && r->spec_id[0] ? r->spec_id : "-", json);
  put_key(&b, "peer", json, false);
  put_string(&b, r->peer && r->peer[0] ? r->peer : "-", json);
  put_key(&b, "status", json, false);
  put_string(&b, wire_grpc_status_name(r->status), json);
  put_key(&b, "in", json, false);
  put_int(&b, (long long)r->bytes_in);
  put_key(&b, "out", json, false);
  put_int(&b, (long long)r->bytes_out);
  put_key(&b, "queue_us", json, false);
  put_int(&b, (long long)r->queue_us);
  put_key(&b, "us", json, false);
  put_int(&b, (long long)r->duration_us);
  if (r->cpu_us >= 0) {
    put_key(&b, "cpu_us", json, false);
    put_int(&b, (long long)r->cpu_us);
  }
  if (r->message != NULL && r->message[0] != '\0') {
    put_key(&b, "msg", json, false);
    put_string(&b, r->message, json);
  }
  if (sample > 1) {
    /* This line stands for N OK requests: readers multiply. */
    put_key(&b, "sample", json, false);
    put_int(&b, (long long)sample);
  }
  finish(&b, json);
}

static void event_line(log_level level, const char *event, const char *fmt,
                       va_list ap) {
  if ((int)level < atomic_load(&current_level)) return;
  bool json = atomic_load(&current_format) == LOG_JSON;
  line_buf b = {.len = 0};
  char text[1024];
  vsnprintf(text, sizeof text, fmt, ap);
  put_time(&b, json, level);
  put_key(&b, "event", json, false);
  put_string(&b, event, json);
  put_key(&b, "msg", json, false);
  put_string(&b, text, json);
  finish(&b, json);
}

void log_event(const char *event, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  event_line(LOG_INFO, event, fmt, ap);
  va_end(ap);
}

void log_event_at(log_level level, const char *event, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  event_line(level, event, fmt, ap);
  va_end(ap);
}
