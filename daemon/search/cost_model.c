/* cost_model.c - lands with the search issue (work in progress). */
typedef int nf__cost_model_placeholder;
