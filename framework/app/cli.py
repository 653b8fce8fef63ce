"""Command-line checks that run before Hydra: clear one-paragraph errors, no tracebacks."""
import difflib
import string
import sys
from pathlib import Path
from typing import Optional, Sequence

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, open_dict
from omegaconf.errors import OmegaConfBaseException

from lightspeed.framework.core import registry
from lightspeed.framework.core.config import CONF_DIR
from lightspeed.framework.core.errors import ConfigError, check, check_writable_dir

MULTIRUN_FLAGS = ("-m", "--multirun")
GROUPS = ("algo", "env", "logger", "distributed", "sweep")  # the groups a command line picks options of


class ComposeError(ConfigError):
    """Hydra could not build a config from the overrides (wrong type, unknown key, ...): its own one paragraph."""

    def __init__(self, message: str):
        self.key = self.value = self.allowed = None
        ValueError.__init__(self, message)


def group_options(group: str) -> list[str]:
    """Selectable options of a config group: registered plugins plus YAML files in conf/."""
    yaml_options = {path.stem for path in (CONF_DIR / group).glob("*.yaml")}
    registered = set(registry.known(group)) if group in registry.ENTRY_POINT_GROUPS else set()
    return sorted(yaml_options | registered)


def _split_choices(value: str) -> list[str]:
    """`a,b` and `choice(a,b)` sweep syntax -> [a, b]."""
    if value.startswith("choice(") and value.endswith(")"):
        value = value[len("choice("):-1]
    return [choice.strip() for choice in value.split(",")]


def check_group_choices(overrides: Sequence[str]) -> None:
    """An unknown `algo=`, `env=`, `logger=`, `distributed=` or `+sweep=` option names the group and lists
    the known ones."""
    for override in overrides:
        group, separator, value = override.lstrip("+~").partition("=")
        if not separator or group not in GROUPS:
            continue
        known = group_options(group)
        for choice in _split_choices(value):
            if choice not in known:
                raise ConfigError(group, choice, f"one of {', '.join(known)}",
                                  f"unknown {group} option{did_you_mean(choice, known)}")


def did_you_mean(name: str, known: Sequence[str]) -> str:
    """"; did you mean x?" for the known names closest to a misspelt one, "" when none is close."""
    # one letter off in a short name (dqm for dqn) scores 0.67: below the cutoff that keeps long keys' matches close
    close = difflib.get_close_matches(name, known, n=2, cutoff=0.6 if len(name) <= 5 else 0.7)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def _one_paragraph(error: Exception) -> str:
    """Hydra's multi-line message and the OmegaConf error under it, as one paragraph."""
    parts = []
    for layer in (error, error.__cause__):
        lines = [line.strip() for line in str(layer or "").splitlines()]
        parts += [line for line in lines if line and not line.startswith(("object_type", "Set the environment"))]
    return "Invalid config: " + "; ".join(parts).replace("full_key: ", "key: ") + "."


def _plain(overrides: Sequence[str]) -> list[str]:
    """The overrides compose() takes: no flags, no hydra.* keys."""
    return [o for o in overrides if not o.lstrip("+~").startswith("hydra.") and not o.startswith("-")]


def check_composes(overrides: Sequence[str]) -> DictConfig:
    """Compose the config once with the overrides (a single run; Hydra checks sweeps itself)."""
    return composed(overrides)[0]


def composed(overrides: Sequence[str]) -> tuple[DictConfig, dict[str, Optional[str]]]:
    """The config the overrides compose (without Hydra's own node) and the option chosen in each group."""
    try:
        with initialize_config_dir(str(CONF_DIR), version_base="1.3", job_name="preflight"):
            cfg = compose("config", overrides=_plain(overrides), return_hydra_config=True)
    except (HydraException, OmegaConfBaseException, ValueError) as error:
        check_keys_exist(overrides)  # a misspelt key: the known keys closest to it, not Hydra's "add it with +"
        raise ComposeError(_one_paragraph(error)) from None
    choices = dict(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, choices


# the line of a conf/algo_env file that names the env ids its settings were tuned for (none: every id of its env)
TUNED_FOR = "# tuned for env.id: "


def tuned_ids(algo_env: Optional[str]) -> list[str]:
    """The env ids a conf/algo_env file says it was tuned for; [] where it does not say (or does not exist)."""
    path = CONF_DIR / "algo_env" / f"{algo_env}.yaml"
    if not algo_env or not path.is_file():
        return []
    lines = [line for line in path.read_text().splitlines() if line.startswith(TUNED_FOR)]
    return [name.strip() for line in lines for name in line[len(TUNED_FOR):].split(",")]


def untuned_settings(cfg: DictConfig, choices: dict, overrides: Sequence[str]) -> Optional[str]:
    """Where the conf/algo_env file a run's algo and env pick was tuned for other env ids than the run's (and the
    command line did not choose it by name): the run's first line, saying that the algorithm's own defaults apply
    and how to apply the file anyway. The caller leaves the file out (~algo_env)."""
    algo_env, env_id = choices.get("algo_env"), cfg.env.get("id")
    ids = tuned_ids(algo_env)
    chosen = any(override.partition("=")[0].lstrip("+") == "algo_env" for override in overrides)
    if not ids or env_id in ids or chosen:
        return None
    return (f"settings: none (conf/algo_env/{algo_env}.yaml is tuned for {', '.join(ids)}, not {env_id}: "
            f"algo={choices['algo']}'s own defaults; algo_env={algo_env} applies it anyway)")


def flat_keys(node, prefix: str = "") -> list[str]:
    """Every key of a composed config, dotted (a list's items not included)."""
    if not isinstance(node, DictConfig):
        return []
    keys = []
    for name in node.keys():
        key = f"{prefix}{name}"
        value = node._get_node(name)
        keys += [key, *([] if isinstance(value, ListConfig) else flat_keys(value, key + "."))]
    return keys


def check_keys_exist(overrides: Sequence[str]) -> None:
    """Each key set on the command line (not added with + or ++) must be a key of the config its group choices
    compose; a misspelt one is refused with the closest known keys."""
    plain = _plain(overrides)
    choices = [o for o in plain if o.partition("=")[0].lstrip("+~") in GROUPS]
    try:
        with initialize_config_dir(str(CONF_DIR), version_base="1.3", job_name="preflight"):
            known = flat_keys(compose("config", overrides=choices))
    except (HydraException, OmegaConfBaseException, ValueError):
        return  # the group choices alone do not compose: Hydra's own message says why
    for override in plain:
        key, separator, value = override.partition("=")
        if separator and not key.startswith(("+", "~")) and key not in GROUPS and key not in known:
            raise ConfigError(key, value, "a key of the config (python run.py --help lists the groups; "
                              "docs/configuration.md every key)", f"unknown key{did_you_mean(key, known)}")


HELP_FLAGS = ("--help", "-h")


def config_groups() -> dict[str, list[str]]:
    """Every group of conf/ (Hydra's own aside) and its options, as Hydra's --help lists them."""
    groups = {path.parent.relative_to(CONF_DIR).as_posix() for path in CONF_DIR.rglob("*.yaml")} - {"."}
    return {group: group_options(group) for group in sorted(groups) if group.split("/")[0] != "hydra"}


def help_text(overrides: Sequence[str]) -> str:
    """conf/hydra/help's template for these overrides: what Hydra's --help prints, without its listing of its own
    groups (seconds of searching its plugins' configs, computed even where the template does not show them)."""
    with initialize_config_dir(str(CONF_DIR), version_base="1.3", job_name="help"):
        cfg = compose("config", overrides=_plain(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # the template's ${hydra:runtime.choices.algo}
    groups = "".join(f"{group}: {', '.join(options)}\n" for group, options in config_groups().items())
    return string.Template(cfg.hydra.help.template).safe_substitute(APP_CONFIG_GROUPS=groups)


def check_output_dir(overrides: Sequence[str], multirun: bool) -> None:
    """The run (or sweep) dir the user chose must be writable; Hydra would only show a traceback."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    for override in overrides:
        name, _, value = override.partition("=")
        if name == key and "${" not in value:
            check_writable_dir(Path(value), key)


def check_resume_names_its_run(overrides: Sequence[str], multirun: bool) -> None:
    """resume=true continues the run in the dir it names: Hydra's default dir is a new one, with no checkpoint."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    resumes = any(override.lower() in ("resume=true", "resume=1") for override in overrides)
    names_dir = any(override.partition("=")[0] == key for override in overrides)
    check(not resumes or names_dir, "resume", True, f"resume=true with {key}=<the dir of the run to continue> (the "
          "stopped run printed that command)", f"without {key} a run gets a new dir, which holds no checkpoint")


# keys whose names the schema cannot know in advance (a gymnax env's own params, custom Ray resources): added,
# not overridden
OPEN_KEYS = ("env.params.", "ray.actor_resources.")


def with_open_keys_added(argv: Sequence[str]) -> list[str]:
    """`env.params.max_steps_in_episode=200` -> `++env.params.max_steps_in_episode=200` (Hydra's add-or-override)."""
    return [f"++{arg}" if arg.startswith(OPEN_KEYS) and "=" in arg else arg for arg in argv]


# preflight's note that it left out an algo_env file tuned for other env ids (the run's first line), or None
SETTINGS_NOTE: Optional[str] = None


def preflight(argv: Sequence[str]) -> list[str]:
    """Exit with status 2 and one paragraph on stderr when the overrides cannot make a config;
    the command line for Hydra, open keys marked as additions."""
    argv = with_open_keys_added(argv)
    overrides = [arg for arg in argv if "=" in arg and not arg.startswith("-")]
    multirun = any(flag in argv for flag in MULTIRUN_FLAGS)
    try:
        check_group_choices(overrides)
        if not multirun:
            global SETTINGS_NOTE
            SETTINGS_NOTE = untuned_settings(*composed(overrides), overrides)
            argv = ["~algo_env", *argv] if SETTINGS_NOTE else argv  # before any flag (--cfg job)
        check_output_dir(overrides, multirun)
        check_resume_names_its_run(overrides, multirun)
    except (ConfigError, ComposeError) as error:
        print(error, file=sys.stderr)
        sys.exit(2)
    return argv
