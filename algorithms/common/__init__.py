"""Small pieces shared by the algorithms: exploration, networks, targets."""
