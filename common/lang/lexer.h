/* lang/lexer.h - tokens of `.nf` source (internal to common/lang).
 *
 * The lexer turns the bytes of an nf_src into tokens one at a time, for
 * the parser's single token of lookahead.  It never reads outside
 * [text, text + len): embedded NULs and any other bytes are allowed in the
 * input and come out as NF_T_ERROR tokens where they are not valid.
 *
 * Invariants:
 *  - Every token has the location of its first byte (line and col 1-based,
 *    col in bytes); NEWLINE tokens point at the '\n', EOF at the end.
 *  - The lexer does not report errors itself: a malformed token (stray
 *    byte, unterminated string, integer above 2^63-1, float out of range,
 *    bad number) is an NF_T_ERROR token whose msg says what is wrong, and
 *    the parser reports it when it meets it (so skipped text never yields
 *    cascades).
 *  - Newline policy: blank lines collapse, and a newline right after a
 *    token that cannot end a statement (a binary operator, `,`, `?`, `:`,
 *    `=`, a reduction operator, `->`, `{`, `(`, `[`) is dropped.  Newlines
 *    inside brackets are dropped by the parser, which knows the nesting.
 *  - `+=!` and `*=!` are single tokens; `+=` and `*=` without `!` are
 *    tokens of their own so the parser can explain them.  `max=!`/`min=!`
 *    are the identifier, `=` and `!` (the parser checks they touch).
 *
 * Memory: float texts and error messages are copied into the arena given
 * to nf__lex_init; an allocation failure sets oom and ends the stream. */
#ifndef NF_LEXER_H
#define NF_LEXER_H

#include <stddef.h>
#include <stdint.h>

#include "../nf_arena.h"
#include "../nf_diag.h"

typedef enum nf_tok_kind {
  NF_T_EOF = 0,
  NF_T_NEWLINE,
  NF_T_ERROR, /* msg says why */
  NF_T_IDENT,
  NF_T_INT,    /* ival */
  NF_T_FLOAT,  /* fval; text is a NUL-terminated arena copy */
  NF_T_STRING, /* off/len cover the contents, without the quotes */
  /* keywords */
  NF_T_DEF,
  NF_T_IMPORT,
  NF_T_FOR,
  NF_T_IN,
  NF_T_WHERE,
  NF_T_REQUIRE,
  NF_T_TRUE,
  NF_T_FALSE,
  /* punctuation */
  NF_T_LPAREN,
  NF_T_RPAREN,
  NF_T_LBRACK,
  NF_T_RBRACK,
  NF_T_LBRACE,
  NF_T_RBRACE,
  NF_T_COMMA,
  NF_T_COLON,
  NF_T_SEMI,
  NF_T_QUESTION,
  NF_T_ASSIGN,      /* = */
  NF_T_PLUS_EQ_BANG, /* +=! */
  NF_T_STAR_EQ_BANG, /* *=! */
  NF_T_PLUS_EQ,     /* += (an error where a reduction is meant) */
  NF_T_STAR_EQ,     /* *= (likewise) */
  NF_T_ARROW,       /* -> */
  NF_T_PLUS,
  NF_T_MINUS,
  NF_T_STAR,
  NF_T_SLASH,
  NF_T_SLASHSLASH,
  NF_T_PERCENT,
  NF_T_BANG,
  NF_T_LT,
  NF_T_LE,
  NF_T_GT,
  NF_T_GE,
  NF_T_EQEQ,
  NF_T_NE,
  NF_T_ANDAND,
  NF_T_OROR,
  NF_T_N_KINDS
} nf_tok_kind;

typedef struct nf_token {
  int kind;        /* nf_tok_kind */
  size_t off, len; /* bytes of the token in src->text */
  nf_loc loc;
  int64_t ival;     /* INT */
  double fval;      /* FLOAT */
  const char *text; /* FLOAT: the literal, NUL-terminated (arena) */
  const char *msg;  /* ERROR: what is wrong (arena) */
} nf_token;

typedef struct nf_lexer {
  const nf_src *src;
  nf_arena *arena;
  size_t pos;        /* next byte to read */
  size_t line_start; /* offset of the current line's first byte */
  uint32_t line;
  int prev; /* kind of the last token returned (for the newline policy) */
  int oom;
} nf_lexer;

/* Prepares lx to read src from its start; arena receives float texts and
 * error messages and must outlive the tokens. */
void nf__lex_init(nf_lexer *lx, const nf_src *src, nf_arena *arena);
/* Reads the next token into *t.  After the end (or an allocation failure,
 * which sets lx->oom) every call returns NF_T_EOF. */
void nf__lex_next(nf_lexer *lx, nf_token *t);
/* The spelling of a punctuation or keyword kind ("+=!", "def"), or a
 * description of the others ("a name", "end of line"); a static string. */
const char *nf__tok_kind_name(int kind);

#endif
