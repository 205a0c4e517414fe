/* placeholder until written */
typedef int idem__placeholder_parser;
