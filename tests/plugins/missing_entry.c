/* A shared library that is not a hasten plugin. */
int not_a_plugin(void) { return 42; }
