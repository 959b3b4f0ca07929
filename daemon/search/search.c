/* search.c - lands with the search issue (work in progress). */
typedef int nf__search_placeholder;
