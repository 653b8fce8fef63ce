"""POPGym through its own package on the host path (`pip install -e ".[popgym]"`, in the test extra): the adapter
one-hot encodes RepeatPreviousEasy's suit, and the episode pays what docs/results.md says it does. An oracle that
names the suit observed three observations back (the card dealt k=4 cards ago, counting the one shown) earns the
most an episode can pay, 48 x 1/48 = 1.0 over 51 steps; answering one fixed suit earns about -0.5."""
import numpy as np
from gymnasium.vector import AutoresetMode

from lightspeed.envs.gymnasium_vector import HostVectorEnv, make_vector_env

REPEAT_PREVIOUS = "popgym:popgym-RepeatPreviousEasy-v0"
NUM_ENVS, EPISODES = 2, 3


def play_episodes(answer) -> list[tuple[float, int]]:
    """(return, length) of the first EPISODES episodes of each env, each step's action `answer(suits seen so far)`."""
    env = HostVectorEnv(make_vector_env(REPEAT_PREVIOUS, NUM_ENVS, max_episode_steps=104,
                                        autoreset_mode=AutoresetMode.SAME_STEP), REPEAT_PREVIOUS)
    assert env.observation_shape == (4,) and env.observation_dtype == np.float32
    obs = env.reset(seed=5)
    seen = [[suit] for suit in decode(obs)]
    ended: list[list[tuple[float, int]]] = [[] for _ in range(NUM_ENVS)]
    while min(len(episodes) for episodes in ended) < EPISODES:
        step = env.step(np.array([answer(history) for history in seen]))
        for index, suit in enumerate(decode(step.obs)):
            if step.ended[index]:
                ended[index].append((float(step.episode_return[index]), int(step.episode_length[index])))
            seen[index] = [suit] if step.started[index] else seen[index] + [suit]
    env.close()
    return [episode for episodes in ended for episode in episodes[:EPISODES]]


def decode(obs: np.ndarray) -> list[int]:
    """The suits of a batch of one-hot observations (each row exactly one 1)."""
    assert np.array_equal(obs.sum(axis=1), np.ones(len(obs))) and set(np.unique(obs)) <= {0.0, 1.0}
    return [int(suit) for suit in obs.argmax(axis=1)]


def test_an_oracle_with_memory_earns_the_most_an_episode_pays():
    episodes = play_episodes(lambda seen: seen[-4] if len(seen) >= 4 else 0)
    assert all(length == 51 for _, length in episodes)
    np.testing.assert_allclose([ret for ret, _ in episodes], 1.0, atol=1e-5)


def test_a_fixed_answer_earns_what_a_guess_does():
    returns = [ret for ret, _ in play_episodes(lambda seen: 0)]
    # 13 of 52 cards are each suit: a fixed answer is right on ~12 of the 48 paid steps, -0.5 on average
    assert all(-0.9 < ret < -0.1 for ret in returns) and abs(np.mean(returns) + 0.5) < 0.25
    assert all(np.isclose(ret * 48, round(ret * 48), atol=1e-4) for ret in returns)  # whole multiples of 1/48
