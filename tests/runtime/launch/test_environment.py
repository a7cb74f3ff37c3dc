"""Tests for multigpu.runtime.launch.environment."""

from multigpu.runtime import launch


def test_laptop_environment_sets_only_what_the_platform_needs_and_the_user_left_unset():
    base = {"PATH": "/usr/bin"}
    laptop = launch.laptop_environment
    assert laptop(base, "darwin") == {**base, "GLOO_SOCKET_IFNAME": "lo0"}
    assert laptop(base, "darwin", torchrun=True) == {
        **base,
        "GLOO_SOCKET_IFNAME": "lo0",
    }
    assert laptop(base, "win32") == base  # spawn: USE_LIBUV is torchrun's
    assert laptop(base, "win32", torchrun=True) == {**base, "USE_LIBUV": "0"}
    assert laptop(base, "linux") == base
    assert laptop(base, "linux", torchrun=True) == base
    # A value the user set is kept.
    mine = {**base, "GLOO_SOCKET_IFNAME": "en0", "USE_LIBUV": "1"}
    assert laptop(mine, "darwin", torchrun=True) == mine
    assert laptop(mine, "win32", torchrun=True) == mine
    # A copy: the caller's mapping (os.environ) is not changed.
    laptop(base, "darwin", torchrun=True)
    assert base == {"PATH": "/usr/bin"}
