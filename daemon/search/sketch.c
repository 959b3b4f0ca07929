/* sketch.c - lands with the search issue (work in progress). */
typedef int nf__sketch_placeholder;
