/* refitctl: one entry point per subcommand area, each in its own file. */
#ifndef REFIT_TOOLS_REFITCTL_H
#define REFIT_TOOLS_REFITCTL_H

/* argv[0] is the area name ("safetensors", "journal" ...). Returns the
 * process exit status: 0 ok, 1 invalid input or a refused check, 2 usage. */
typedef int (*ctl_main_fn)(int argc, char **argv);

int ctl_safetensors(int argc, char **argv);
int ctl_journal(int argc, char **argv);
int ctl_fleet(int argc, char **argv);
int ctl_formats(int argc, char **argv);
int ctl_validate(int argc, char **argv);
int ctl_manifest(int argc, char **argv);
int ctl_convert(int argc, char **argv);
int ctl_metrics(int argc, char **argv);
int ctl_snapshot(int argc, char **argv);
int ctl_version(int argc, char **argv);

#endif
