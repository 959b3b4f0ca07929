/* lang/lexer.c - tokens of `.nf` source (see lexer.h).
 *
 * A hand-written scanner over [text, text + len).  Every read goes through
 * at(), which answers -1 past the end, so embedded NULs, a missing final
 * newline or a token running to the end of the input are all safe.
 * Malformed input never stops the scanner: it returns an NF_T_ERROR token
 * covering at least one byte and carries on from there. */
#include "lexer.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const kind_names[NF_T_N_KINDS] = {
    [NF_T_EOF] = "end of file",
    [NF_T_NEWLINE] = "end of line",
    [NF_T_ERROR] = "an invalid token",
    [NF_T_IDENT] = "a name",
    [NF_T_INT] = "an integer",
    [NF_T_FLOAT] = "a float",
    [NF_T_STRING] = "a string",
    [NF_T_DEF] = "def",
    [NF_T_IMPORT] = "import",
    [NF_T_FOR] = "for",
    [NF_T_IN] = "in",
    [NF_T_WHERE] = "where",
    [NF_T_REQUIRE] = "require",
    [NF_T_TRUE] = "true",
    [NF_T_FALSE] = "false",
    [NF_T_LPAREN] = "(",
    [NF_T_RPAREN] = ")",
    [NF_T_LBRACK] = "[",
    [NF_T_RBRACK] = "]",
    [NF_T_LBRACE] = "{",
    [NF_T_RBRACE] = "}",
    [NF_T_COMMA] = ",",
    [NF_T_COLON] = ":",
    [NF_T_SEMI] = ";",
    [NF_T_QUESTION] = "?",
    [NF_T_ASSIGN] = "=",
    [NF_T_PLUS_EQ_BANG] = "+=!",
    [NF_T_STAR_EQ_BANG] = "*=!",
    [NF_T_PLUS_EQ] = "+=",
    [NF_T_STAR_EQ] = "*=",
    [NF_T_ARROW] = "->",
    [NF_T_PLUS] = "+",
    [NF_T_MINUS] = "-",
    [NF_T_STAR] = "*",
    [NF_T_SLASH] = "/",
    [NF_T_SLASHSLASH] = "//",
    [NF_T_PERCENT] = "%",
    [NF_T_BANG] = "!",
    [NF_T_LT] = "<",
    [NF_T_LE] = "<=",
    [NF_T_GT] = ">",
    [NF_T_GE] = ">=",
    [NF_T_EQEQ] = "==",
    [NF_T_NE] = "!=",
    [NF_T_ANDAND] = "&&",
    [NF_T_OROR] = "||",
};

const char *nf__tok_kind_name(int kind) {
  if (kind < 0 || kind >= NF_T_N_KINDS || !kind_names[kind]) return "?";
  return kind_names[kind];
}

static const struct {
  const char *word;
  int kind;
} keywords[] = {
    {"def", NF_T_DEF},     {"import", NF_T_IMPORT},   {"for", NF_T_FOR},
    {"in", NF_T_IN},       {"where", NF_T_WHERE},     {"require", NF_T_REQUIRE},
    {"true", NF_T_TRUE},   {"false", NF_T_FALSE},
};

/* Whether a newline right after a token of this kind is dropped. */
static int continues(int kind) {
  switch (kind) {
  case NF_T_NEWLINE: /* blank lines collapse; also the start of the file */
  case NF_T_SEMI:
  case NF_T_LPAREN:
  case NF_T_LBRACK:
  case NF_T_LBRACE:
  case NF_T_COMMA:
  case NF_T_COLON:
  case NF_T_QUESTION:
  case NF_T_ASSIGN:
  case NF_T_PLUS_EQ_BANG:
  case NF_T_STAR_EQ_BANG:
  case NF_T_PLUS_EQ:
  case NF_T_STAR_EQ:
  case NF_T_ARROW:
  case NF_T_PLUS:
  case NF_T_MINUS:
  case NF_T_STAR:
  case NF_T_SLASH:
  case NF_T_SLASHSLASH:
  case NF_T_PERCENT:
  case NF_T_BANG:
  case NF_T_LT:
  case NF_T_LE:
  case NF_T_GT:
  case NF_T_GE:
  case NF_T_EQEQ:
  case NF_T_NE:
  case NF_T_ANDAND:
  case NF_T_OROR:
    return 1;
  default:
    return 0;
  }
}

void nf__lex_init(nf_lexer *lx, const nf_src *src, nf_arena *arena) {
  memset(lx, 0, sizeof *lx);
  lx->src = src;
  lx->arena = arena;
  lx->line = 1;
  lx->prev = NF_T_NEWLINE;
}

/* The byte at offset i, or -1 at or past the end. */
static int at(const nf_lexer *lx, size_t i) {
  return i < lx->src->len ? (unsigned char)lx->src->text[i] : -1;
}

static int is_digit(int c) { return c >= '0' && c <= '9'; }
static int is_ident_start(int c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static int is_ident(int c) { return is_ident_start(c) || is_digit(c); }

static nf_loc loc_at(const nf_lexer *lx, size_t off) {
  nf_loc l;
  size_t col = off - lx->line_start + 1;
  l.src = lx->src;
  l.line = lx->line;
  l.col = col > UINT32_MAX ? UINT32_MAX : (uint32_t)col;
  return l;
}

/* Turns *t into an ERROR token with a formatted message.  Token text shown
 * in messages is cut at 40 bytes. */
static void set_error(nf_lexer *lx, nf_token *t, const char *fmt, ...)
    NF_PRINTF(3, 4);
static void set_error(nf_lexer *lx, nf_token *t, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  t->kind = NF_T_ERROR;
  t->msg = nf_arena_strdup(lx->arena, msg);
  if (!t->msg) lx->oom = 1;
}

/* The token text cut for a message: writes at most 40 bytes plus "...". */
static void excerpt(const nf_lexer *lx, const nf_token *t, char *out,
                    size_t cap) {
  size_t n = t->len > 40 ? 40 : t->len;
  snprintf(out, cap, "%.*s%s", (int)n, lx->src->text + t->off,
           t->len > 40 ? "..." : "");
}

static void lex_number(nf_lexer *lx, nf_token *t) {
  size_t p = lx->pos;
  int is_float = 0;
  while (is_digit(at(lx, p))) p++;
  if (at(lx, p) == '.') {
    is_float = 1;
    p++;
    while (is_digit(at(lx, p))) p++;
  }
  if (at(lx, p) == 'e' || at(lx, p) == 'E') {
    size_t q = p + 1;
    if (at(lx, q) == '+' || at(lx, q) == '-') q++;
    if (is_digit(at(lx, q))) {
      is_float = 1;
      p = q;
      while (is_digit(at(lx, p))) p++;
    }
  }
  int bad = 0;
  while (is_ident(at(lx, p)) || at(lx, p) == '.') {
    bad = 1;
    p++;
  }
  t->len = p - lx->pos;
  lx->pos = p;
  char shown[48];
  excerpt(lx, t, shown, sizeof shown);
  if (bad) {
    set_error(lx, t, "invalid number '%s'", shown);
    return;
  }
  const char *s = lx->src->text + t->off;
  if (!is_float) {
    int64_t v = 0;
    for (size_t i = 0; i < t->len; i++) {
      int dgt = s[i] - '0';
      if (v > (INT64_MAX - dgt) / 10) {
        set_error(lx, t,
                  "integer literal '%s' too large (the largest is "
                  "9223372036854775807)",
                  shown);
        return;
      }
      v = v * 10 + dgt;
    }
    t->kind = NF_T_INT;
    t->ival = v;
    return;
  }
  char *text = nf_arena_strndup(lx->arena, s, t->len);
  if (!text) {
    lx->oom = 1;
    return;
  }
  double v = strtod(text, NULL);
  if (isinf(v) || isnan(v)) {
    set_error(lx, t, "float literal '%s' out of range", shown);
    return;
  }
  t->kind = NF_T_FLOAT;
  t->fval = v;
  t->text = text;
}

static void lex_string(nf_lexer *lx, nf_token *t) {
  size_t p = lx->pos + 1;
  int c;
  while ((c = at(lx, p)) != -1 && c != '"' && c != '\n') p++;
  if (c != '"') {
    lx->pos = p; /* up to the newline or the end; the newline stays */
    t->len = p - t->off;
    set_error(lx, t, "unterminated string literal");
    return;
  }
  lx->pos = p + 1;
  t->off = t->off + 1;
  t->len = p - t->off;
  if (memchr(lx->src->text + t->off, 0, t->len)) {
    set_error(lx, t, "invalid byte 0x00 in string literal");
    return;
  }
  t->kind = NF_T_STRING;
}

/* Punctuation: sets t->kind and advances, or returns 0. */
static int lex_punct(nf_lexer *lx, nf_token *t) {
  int c = at(lx, lx->pos), c1 = at(lx, lx->pos + 1), c2 = at(lx, lx->pos + 2);
  int k, n = 1;
  switch (c) {
  case '(': k = NF_T_LPAREN; break;
  case ')': k = NF_T_RPAREN; break;
  case '[': k = NF_T_LBRACK; break;
  case ']': k = NF_T_RBRACK; break;
  case '{': k = NF_T_LBRACE; break;
  case '}': k = NF_T_RBRACE; break;
  case ',': k = NF_T_COMMA; break;
  case ':': k = NF_T_COLON; break;
  case ';': k = NF_T_SEMI; break;
  case '?': k = NF_T_QUESTION; break;
  case '%': k = NF_T_PERCENT; break;
  case '+':
    if (c1 == '=') {
      k = c2 == '!' ? NF_T_PLUS_EQ_BANG : NF_T_PLUS_EQ;
      n = c2 == '!' ? 3 : 2;
    } else {
      k = NF_T_PLUS;
    }
    break;
  case '*':
    if (c1 == '=') {
      k = c2 == '!' ? NF_T_STAR_EQ_BANG : NF_T_STAR_EQ;
      n = c2 == '!' ? 3 : 2;
    } else {
      k = NF_T_STAR;
    }
    break;
  case '-':
    if (c1 == '>') k = NF_T_ARROW, n = 2;
    else k = NF_T_MINUS;
    break;
  case '/':
    if (c1 == '/') k = NF_T_SLASHSLASH, n = 2;
    else k = NF_T_SLASH;
    break;
  case '=':
    if (c1 == '=') k = NF_T_EQEQ, n = 2;
    else k = NF_T_ASSIGN;
    break;
  case '!':
    if (c1 == '=') k = NF_T_NE, n = 2;
    else k = NF_T_BANG;
    break;
  case '<':
    if (c1 == '=') k = NF_T_LE, n = 2;
    else k = NF_T_LT;
    break;
  case '>':
    if (c1 == '=') k = NF_T_GE, n = 2;
    else k = NF_T_GT;
    break;
  case '&':
    if (c1 != '&') return 0;
    k = NF_T_ANDAND, n = 2;
    break;
  case '|':
    if (c1 != '|') return 0;
    k = NF_T_OROR, n = 2;
    break;
  default:
    return 0;
  }
  t->kind = k;
  t->len = (size_t)n;
  lx->pos += (size_t)n;
  return 1;
}

void nf__lex_next(nf_lexer *lx, nf_token *t) {
  memset(t, 0, sizeof *t);
  for (;;) {
    int c = at(lx, lx->pos);
    if (lx->oom) c = -1;
    if (c == ' ' || c == '\t' || c == '\r') {
      lx->pos++;
      continue;
    }
    if (c == '#') {
      while (at(lx, lx->pos) != -1 && at(lx, lx->pos) != '\n') lx->pos++;
      continue;
    }
    t->off = lx->pos;
    t->loc = loc_at(lx, lx->pos);
    if (c == -1) {
      if (!lx->oom) lx->pos = lx->src->len;
      t->kind = NF_T_EOF;
      lx->prev = NF_T_EOF;
      return;
    }
    if (c == '\n') {
      lx->pos++;
      if (lx->line < UINT32_MAX) lx->line++;
      lx->line_start = lx->pos;
      if (continues(lx->prev)) continue;
      t->kind = NF_T_NEWLINE;
      t->len = 1;
      lx->prev = NF_T_NEWLINE;
      return;
    }
    break;
  }
  int c = at(lx, lx->pos);
  if (is_ident_start(c)) {
    size_t p = lx->pos;
    while (is_ident(at(lx, p))) p++;
    t->len = p - lx->pos;
    lx->pos = p;
    t->kind = NF_T_IDENT;
    for (size_t i = 0; i < sizeof keywords / sizeof keywords[0]; i++)
      if (strlen(keywords[i].word) == t->len &&
          memcmp(keywords[i].word, lx->src->text + t->off, t->len) == 0)
        t->kind = keywords[i].kind;
  } else if (is_digit(c) || (c == '.' && is_digit(at(lx, lx->pos + 1)))) {
    lex_number(lx, t);
  } else if (c == '"') {
    lex_string(lx, t);
  } else if (!lex_punct(lx, t)) {
    lx->pos++;
    t->len = 1;
    if (c > 0x20 && c < 0x7f)
      set_error(lx, t, "stray character '%c'", c);
    else if (c >= 0x80)
      set_error(lx, t,
                "invalid byte 0x%02x (outside strings and comments, .nf "
                "text is ASCII)",
                (unsigned)c);
    else
      set_error(lx, t, "invalid byte 0x%02x", (unsigned)c);
  }
  if (lx->oom) {
    memset(t, 0, sizeof *t);
    t->kind = NF_T_EOF;
    t->loc = loc_at(lx, lx->pos);
  }
  lx->prev = t->kind;
}
