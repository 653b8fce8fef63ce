"""The host-env layer against independent references: a tiny deterministic env of this file, stepped by hand
(one plain env, manual resets), gives the transitions every HostVectorEnv must reproduce in each autoreset
mode, in process and in worker processes alike. envs.gymnasium_env (which imports JAX through envs/) is
imported inside the tests: worker processes import this module to unpickle the test env, and stay light."""
import multiprocessing
import os
import signal
import time
import types

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from lightspeed.envs.gymnasium_vector import HostVectorEnv, make_vector_env, pip_hint, worker_slices
from lightspeed.framework.core.errors import ConfigError, PluginError
from lightspeed.framework.core.host_env import HostEnvError, host_evaluate
from lightspeed.framework.core.spaces import Discrete

TEST_ID, UNCAPPED_ID = "LightspeedTestCountdown-v0", "LightspeedTestUncapped-v0"
STEP_CAP = 6  # the registered cap: episodes drawn longer than this are truncated by TimeLimit
MODES = (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED)


class CountdownEnv(gymnasium.Env):
    """Episodes of 1 to 8 steps drawn at each reset, ending terminated or truncated (by the env itself) as
    drawn; longer than the cap, TimeLimit truncates them. Observations carry the episode's draw, the step
    and the last action, so a transition out of order or a lost action shows."""

    metadata = {"render_modes": []}

    def __init__(self, observation: str = "vector", fail_seed: int = -1, fail_step: int = 0, hang_seed: int = -1,
                 continuous: bool = False):
        self.kind, self.fail_seed, self.fail_step, self.hang_seed = observation, fail_seed, fail_step, hang_seed
        self.action_space = spaces.Box(-1.0, 1.0, (1,)) if continuous else spaces.Discrete(3)
        self.observation_space = {
            "vector": spaces.Box(-np.inf, np.inf, (3,), np.float32),
            "discrete": spaces.Discrete(7),
            "bool": spaces.Box(0, 1, (2, 2, 3), bool),
            "image": spaces.Box(0, 255, (3, 2, 4), np.uint8),
            "dict": spaces.Dict({"x": spaces.Discrete(2)}),
        }[observation]
        self.first_seed, self.steps_taken = None, 0

    def _observe(self, action: int) -> object:
        if self.kind == "discrete":
            return self.t
        if self.kind == "bool":
            return (np.arange(12).reshape(2, 2, 3) + self.t + action) % 3 == 0
        if self.kind == "image":
            return (np.arange(24).reshape(3, 2, 4) * (self.t + 1) + action).astype(np.uint8)
        return np.array([self.draw, self.t, action], np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        if self.first_seed is None:
            self.first_seed = seed
        self.t, self.draw = 0, float(self.np_random.uniform())
        self.length, self.truncates = int(self.np_random.integers(1, 9)), bool(self.np_random.integers(2))
        return self._observe(0), {}

    def step(self, action: int) -> tuple:
        self.t, self.steps_taken = self.t + 1, self.steps_taken + 1
        if self.first_seed == self.fail_seed and self.steps_taken == self.fail_step:
            raise RuntimeError("boom at the failing step")
        if self.first_seed == self.hang_seed and self.steps_taken == self.fail_step:
            time.sleep(60)
        end = self.t == self.length
        reward = float(action) + 0.25 * self.t + self.draw
        return self._observe(int(action)), reward, end and not self.truncates, end and self.truncates, {"t": self.t}


for env_id, cap in ((TEST_ID, STEP_CAP), (UNCAPPED_ID, None)):
    if env_id not in gymnasium.registry:
        gymnasium.register(env_id, entry_point=CountdownEnv, max_episode_steps=cap)


def action_schedule(num_steps: int, num_envs: int, seed: int = 7) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 3, (num_steps, num_envs))


def hand_stepped(mode: AutoresetMode, seed: int, actions: np.ndarray, kwargs: dict) -> list[dict]:
    """One env stepped by hand with manual resets, one row per vector step: whether it acted, the
    transition (obs, action, reward, terminated, truncated, final_obs) and the observation acted on next."""
    env = gymnasium.make(TEST_ID, **kwargs)
    obs, _ = env.reset(seed=seed)
    rows, reset_pending = [], False
    for action in actions:
        if reset_pending:  # NEXT_STEP: this step only resets; the action is ignored
            obs, _ = env.reset()
            rows.append({"acted": False, "obs": obs, "started": True})
            reset_pending = False
            continue
        next_obs, reward, terminated, truncated, _ = env.step(int(action))
        row = {"acted": True, "transition": (obs, int(action), reward, terminated, truncated, next_obs)}
        obs, started = next_obs, False
        if terminated or truncated:
            reset_pending = mode == AutoresetMode.NEXT_STEP
            if not reset_pending:
                obs, _ = env.reset()
                started = True
        rows.append({**row, "obs": obs, "started": started})
    env.close()
    return rows


def play(env: HostVectorEnv, seed: int, actions: np.ndarray) -> tuple[np.ndarray, list]:
    obs = env.reset(seed)
    return obs, [env.step(step_actions) for step_actions in actions]


def host_transitions(reset_obs: np.ndarray, steps: list, actions: np.ndarray, index: int) -> list[dict]:
    """The same rows read off a HostVectorEnv's steps for env `index`."""
    rows, obs = [], reset_obs[index]
    for step, step_actions in zip(steps, actions, strict=True):
        row = {"acted": bool(step.acted[index]), "obs": step.obs[index], "started": bool(step.started[index])}
        if step.acted[index]:
            row["transition"] = (obs, int(step_actions[index]), step.reward[index], bool(step.terminated[index]),
                                 bool(step.truncated[index]), step.final_obs[index])
        else:
            assert step.reward[index] == 0 and not step.ended[index]
            assert np.array_equal(step.final_obs[index], step.obs[index])
        rows.append(row)
        obs = step.obs[index]
    return rows


def assert_same_rows(host: list[dict], reference: list[dict], encode=lambda obs: obs) -> None:
    assert [row["acted"] for row in host] == [row["acted"] for row in reference]
    assert [row["started"] for row in host] == [row["started"] for row in reference]
    for got, want in zip(host, reference, strict=True):
        assert np.array_equal(got["obs"], encode(want["obs"]))
        if want["acted"]:
            obs, action, reward, terminated, truncated, final_obs = want["transition"]
            got_obs, got_action, got_reward, got_terminated, got_truncated, got_final = got["transition"]
            assert np.array_equal(got_obs, encode(obs)) and got_action == action
            assert got_reward == np.float32(reward) and (got_terminated, got_truncated) == (terminated, truncated)
            assert np.array_equal(got_final, encode(final_obs))


def reference_episodes(rows: list[dict]) -> list[tuple[float, int]]:
    """(return, length) of every episode that ended, from the hand-stepped transitions."""
    episodes, total, length = [], 0.0, 0
    for row in rows:
        if row["acted"]:
            _, _, reward, terminated, truncated, _ = row["transition"]
            total, length = total + reward, length + 1
            if terminated or truncated:
                episodes.append((np.float32(total), length))
                total, length = 0.0, 0
    return episodes


def end_kinds(rows: list[dict]) -> set[str]:
    kinds = set()
    for row in rows:
        if row["acted"]:
            obs, _, _, terminated, truncated, final_obs = row["transition"]
            step = int(final_obs[1])
            kinds |= {"terminated"} if terminated else set()
            kinds |= {"truncated at the cap" if step == STEP_CAP else "truncated by the env"} if truncated else set()
    return kinds


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.value)
def test_every_mode_reproduces_the_hand_stepped_transitions(mode):
    num_envs, seed = 3, 11
    actions = action_schedule(40, num_envs)
    env = HostVectorEnv(make_vector_env(TEST_ID, num_envs, autoreset_mode=mode), TEST_ID)
    reset_obs, steps = play(env, seed, actions)
    env.close()
    kinds = set()
    for index in range(num_envs):
        reference = hand_stepped(mode, seed + index, actions[:, index], {})
        assert_same_rows(host_transitions(reset_obs, steps, actions, index), reference)
        ended = [(step.episode_return[index], step.episode_length[index]) for step in steps if step.ended[index]]
        assert ended == reference_episodes(reference)
        kinds |= end_kinds(reference)
    # the schedule reaches every kind of end, and NEXT_STEP's reset steps are there to be flagged
    assert kinds == {"terminated", "truncated by the env", "truncated at the cap"}
    assert (mode == AutoresetMode.NEXT_STEP) == any((~step.acted).any() for step in steps)
    assert all(step.reward.dtype == np.float32 and step.episode_length.dtype == np.int32 for step in steps)


@pytest.mark.parametrize("observation", ["discrete", "bool", "image"])
def test_observations_are_encoded_for_networks(observation):
    """Discrete: one-hot float32; bool kept bool; a declared [C, H, W] image becomes [H, W, C]."""
    kwargs, seed, actions = {"observation": observation}, 3, action_schedule(20, 2)
    encode = {"discrete": lambda obs: np.eye(7, dtype=np.float32)[obs], "bool": lambda obs: obs,
              "image": lambda obs: np.moveaxis(obs, 0, -1)}[observation]
    vector = make_vector_env(TEST_ID, 2, kwargs, autoreset_mode=AutoresetMode.SAME_STEP,
                             channels_first=observation == "image")
    env = HostVectorEnv(vector, TEST_ID)
    expected = {"discrete": ((7,), np.float32), "bool": ((2, 2, 3), np.bool_), "image": ((2, 4, 3), np.uint8)}
    assert (env.observation_shape, env.observation_dtype) == expected[observation]
    reset_obs, steps = play(env, seed, actions)
    env.close()
    assert reset_obs.dtype == expected[observation][1] and steps[0].final_obs.dtype == expected[observation][1]
    for index in range(2):
        reference = hand_stepped(AutoresetMode.SAME_STEP, seed + index, actions[:, index], kwargs)
        assert_same_rows(host_transitions(reset_obs, steps, actions, index), reference, encode)


def worker_pids_gone(pids: list[int], within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(os.path.exists(f"/proc/{pid}") for pid in pids)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.value)
def test_worker_processes_equal_in_process_bit_for_bit(mode):
    """Five envs over two workers (3 + 2), Ctrl-C sent to the workers midway: the same steps as in process."""
    actions, seed = action_schedule(30, 5), 21
    local = HostVectorEnv(make_vector_env(TEST_ID, 5, autoreset_mode=mode), TEST_ID)
    expected_reset, expected = play(local, seed, actions)
    local.close()
    vector = make_vector_env(TEST_ID, 5, num_workers=2, autoreset_mode=mode)
    pids = vector.worker_pids
    remote = HostVectorEnv(vector, TEST_ID)
    reset_obs, steps = remote.reset(seed), []
    for step_index, step_actions in enumerate(actions):
        if step_index == 10:
            for pid in pids:
                os.kill(pid, signal.SIGINT)  # as Ctrl-C reaches the whole process group
        steps.append(remote.step(step_actions))
    remote.close()
    assert np.array_equal(reset_obs, expected_reset)
    for got, want in zip(steps, expected, strict=True):
        for field in ("obs", "reward", "terminated", "truncated", "final_obs", "acted", "episode_return",
                      "episode_length", "ended"):
            assert getattr(got, field).dtype == getattr(want, field).dtype
            assert np.array_equal(getattr(got, field), getattr(want, field)), field
    assert worker_pids_gone(pids)


def test_worker_slices_cover_every_env_once():
    assert worker_slices(5, 2) == [(0, 2), (2, 5)]
    for num_envs in range(1, 12):
        for num_workers in range(1, num_envs + 1):
            slices = worker_slices(num_envs, num_workers)
            assert [index for start, stop in slices for index in range(start, stop)] == list(range(num_envs))
            assert all(stop > start for start, stop in slices)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_env_that_raises_names_the_id_and_index_and_leaves_no_process(num_workers):
    seed, failing = 100, 3
    vector = make_vector_env(TEST_ID, 4, {"fail_seed": seed + failing, "fail_step": 2}, num_workers=num_workers,
                             autoreset_mode=AutoresetMode.SAME_STEP)
    pids = getattr(vector, "worker_pids", [])
    env = HostVectorEnv(vector, TEST_ID)
    env.reset(seed)
    env.step(np.zeros(4, int))
    with pytest.raises(HostEnvError) as raised:
        env.step(np.zeros(4, int))
    env.close()
    assert raised.value.env_id == TEST_ID and raised.value.env_index == failing
    message = str(raised.value)
    assert TEST_ID in message and f"env index {failing}" in message and "boom at the failing step" in message
    assert "\n" not in message
    if num_workers:
        assert raised.value.worker == 1 and worker_pids_gone(pids)
        assert not [child for child in multiprocessing.active_children() if child.pid in pids]


def test_a_hung_worker_times_out_naming_the_worker_and_leaves_no_process():
    seed = 50
    vector = make_vector_env(TEST_ID, 4, {"hang_seed": seed + 1, "fail_step": 2}, num_workers=2,
                             autoreset_mode=AutoresetMode.NEXT_STEP, timeout_s=2.0)
    pids = vector.worker_pids
    env = HostVectorEnv(vector, TEST_ID)
    env.reset(seed)
    env.step(np.zeros(4, int))
    with pytest.raises(HostEnvError, match=r"worker 0: it holds envs 0 to 1 and gave no answer to step within 2 s"
                       ) as raised:
        env.step(np.zeros(4, int))
    env.close()
    assert raised.value.env_id == TEST_ID and TEST_ID in str(raised.value) and raised.value.worker == 0
    assert worker_pids_gone(pids)


def test_a_vector_env_without_an_autoreset_mode_is_a_plugin_error():
    vector = SyncVectorEnv([lambda: gymnasium.make(TEST_ID)])
    del vector.metadata["autoreset_mode"]
    with pytest.raises(PluginError, match="autoreset_mode"):
        HostVectorEnv(vector, TEST_ID)
    vector.close()


def greedy(obs: np.ndarray) -> np.ndarray:
    """A deterministic policy of the observation alone (the draw decides)."""
    return (obs[:, 0] * 10).astype(int) % 3


def hand_played_return(seed: int) -> float:
    env = gymnasium.make(TEST_ID)
    obs, _ = env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(int(greedy(obs[None])[0]))
        total, done = total + reward, terminated or truncated
    return total


def test_host_evaluate_plays_each_episode_from_its_own_seed():
    from lightspeed.envs.gymnasium_env import GymnasiumConfig, evaluation_env_maker

    make_env = evaluation_env_maker(GymnasiumConfig(id=TEST_ID))
    starts = []

    def act(obs: np.ndarray, start: np.ndarray) -> np.ndarray:
        starts.append(start.copy())
        return greedy(obs)

    returns = host_evaluate(make_env, act, episode_seeds=range(40, 47), num_envs=3)
    assert returns.shape == (7,)
    assert returns.tolist() == [hand_played_return(40 + episode) for episode in range(7)]
    # each episode's first act says so, in its slot: 7 starts, 3 at once on the first call
    assert np.asarray(starts).sum() == 7 and starts[0].tolist() == [True, True, True]
    assert host_evaluate(make_env, lambda obs, start: greedy(obs), episode_seeds=[45, 41],
                         num_envs=2).tolist() == [returns[5], returns[1]]


def config_error(**fields) -> ConfigError:
    from lightspeed.envs.gymnasium_env import GymnasiumConfig, check_env_id

    with pytest.raises(ConfigError) as raised:
        check_env_id(GymnasiumConfig(**fields))
    assert "\n" not in str(raised.value)
    return raised.value


def test_bad_inputs_are_one_paragraph_config_errors():
    unknown = config_error(id="CartPol-v1")
    assert unknown.key == "env.id" and "CartPole-v1" in str(unknown) and "no env is registered" in str(unknown)
    module = config_error(id="no_such_module_xyz:Foo-v0")
    assert module.key == "env.id" and "no module named 'no_such_module_xyz'" in str(module)
    assert "install the package" in str(module)
    assert "Dict" in str(config_error(id=TEST_ID, kwargs={"observation": "dict"}))
    assert config_error(id=UNCAPPED_ID).key == "env.max_episode_steps"
    assert config_error(id=TEST_ID, kwargs={"colour": "red"}).key == "env.kwargs"
    assert config_error(id=TEST_ID, channels_first=True).key == "env.channels_first"
    assert config_error(id=TEST_ID, num_workers=-1).key == "env.num_workers"
    assert config_error(id=TEST_ID, max_episode_steps=0).key == "env.max_episode_steps"
    assert config_error(id="").key == "env.id"
    with pytest.raises(ConfigError, match="env.num_workers"):
        make_vector_env(TEST_ID, 2, num_workers=3)
    assert pip_hint("minatar.gym") == 'pip install "lightspeed[minatar]"'


class EchoBoxEnv(gymnasium.Env):
    """2-D Box actions in [-1, 1] x [0, 2]; its observation is the action it was handed, as it got it."""

    metadata = {"render_modes": []}
    action_space = spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 2.0], np.float32))
    observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action: np.ndarray) -> tuple:
        assert isinstance(action, np.ndarray) and action.dtype == np.float32 and action.shape == (2,)
        return np.array(action, np.float32), 0.0, False, False, {}


ECHO_ID = "LightspeedTestEchoBox-v0"
if ECHO_ID not in gymnasium.registry:
    gymnasium.register(ECHO_ID, entry_point=EchoBoxEnv, max_episode_steps=5)


def test_box_actions_pass_through_with_their_shape_and_dtype_clipped_to_the_bounds():
    from lightspeed.framework.core.spaces import Box

    env = HostVectorEnv(make_vector_env(ECHO_ID, 2), ECHO_ID)
    assert env.action_space == Box(np.array([-1.0, 0.0]), np.array([1.0, 2.0]), (2,), np.float32)
    env.reset(seed=0)
    step = env.step(np.array([[0.5, 1.5], [-3.0, 7.0]], np.float64))
    np.testing.assert_array_equal(step.obs, [[0.5, 1.5], [-1.0, 2.0]])  # the second clipped to the bounds
    env.close()


def test_a_discrete_action_algorithm_on_a_box_env_is_refused_in_one_paragraph(cli):
    result = cli("algo=dqn", "env=gymnasium", f"env.id=tests.test_host_env:{ECHO_ID}")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("Invalid config: env='gymnasium'") and "Box(shape=(2,), float32" in message
    assert "algo=dqn acts in discrete" in message


def test_an_explicit_cap_makes_an_uncapped_id_usable():
    from lightspeed.envs.gymnasium_env import GymnasiumConfig, make_host_env

    env = make_host_env(GymnasiumConfig(id=UNCAPPED_ID, max_episode_steps=2), 2)
    env.reset(0)
    steps = [env.step(np.zeros(2, int)) for _ in range(2)]
    env.close()
    # every episode ends by its second step: at the env's own end, or truncated at the explicit cap
    assert (steps[0].ended | steps[1].ended).all()
    assert all(length <= 2 for step in steps for length in step.episode_length)


def test_minatar_keeps_bool_observations_and_its_step_caps():
    pytest.importorskip("minatar")
    from lightspeed.envs.gymnasium_env import GymnasiumConfig, check_env_id, make_host_env

    assert check_env_id(GymnasiumConfig(id="MinAtar/Freeway-v1")).max_episode_steps == 2500
    env = make_host_env(GymnasiumConfig(id="MinAtar/Breakout-v1"), 2, AutoresetMode.SAME_STEP)
    assert (env.observation_dtype, env.observation_shape) == (np.bool_, (10, 10, 4))
    assert env.action_space == Discrete(3)
    obs = env.reset(0)
    step = env.step(np.zeros(2, int))
    env.close()
    assert obs.dtype == np.bool_ and step.obs.dtype == np.bool_ and step.final_obs.dtype == np.bool_


def test_greedy_returns_of_some_seeds_are_those_seeds_rows():
    from lightspeed.envs.gymnasium_env import GymnasiumConfig, make_gymnasium
    from lightspeed.framework.sebulba.trainer import greedy_returns, same_policy_seeds

    env, _ = make_gymnasium(GymnasiumConfig(id=TEST_ID))
    params = {"action": np.array([2, 0, 1])}  # seed s always plays action params["action"][s]
    policy = types.SimpleNamespace(act=lambda params, state, obs, start, key: (params["action"], state),
                                   act_init=lambda episode: ())
    every = greedy_returns(env, policy, params, 3, 4, first_seed=10)
    assert len({tuple(row) for row in every.tolist()}) == 3  # the seeds' returns differ
    some = greedy_returns(env, policy, params, 3, 4, first_seed=10, seeds=[2, 1])
    assert some.tolist() == [every[2].tolist(), every[1].tolist()]
    assert same_policy_seeds(params, {"action": np.array([2, 1, 1])}, 3).tolist() == [True, False, True]
