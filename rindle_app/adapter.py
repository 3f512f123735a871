"""The extension point a host project subclasses to tell rindle about its users."""


class RindleAdapter:
    """
    Decides who may do what. Select a subclass with ``RINDLE["ADAPTER"]``.

    Every hook receives the acting Django user (``None`` or an anonymous user when
    nobody is authenticated); the user never comes from client-supplied arguments.
    """

    def authorize_mutation(self, user, name, args):
        """Return False (or raise PermissionDenied) to reject a client mutation."""
        return True


def get_adapter():
    from .conf import rindle_settings

    return rindle_settings.ADAPTER()
